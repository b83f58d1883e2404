"""Where forward+backward's host time goes (GPU): each step of a RopeFunction added one at a time.

    python scripts/probe_host.py

On the bench's tiny host shape, every variant below runs ``torch.autograd.grad`` on its outputs
in a loop (``bench.host_us``), the variants taking turns for several rounds; each prints its
median round. The steps: an autograd.Function that returns views (the bench's floor); one that
returns fresh outputs; our forward with an empty backward; plus the backward's allocations; plus
its launch (RopeFunction itself); apply_rope; Liger. The difference between two neighbours is
what that step costs.
"""
import time

import torch

from ropetut import apply_rope, bench, rope_tables, standard
from ropetut.autograd import RopeFunction
from ropetut.kernels import KERNELS, rotate
from ropetut.validate import RopeOptions, check_rope_args

shape = bench.HOST_SHAPE
cos, sin = rope_tables(standard(shape.D), shape.T, device="cuda")
options = RopeOptions(cos, sin, None, False, shape.D, False, KERNELS["final"])
backward_s = []      # seconds spent inside the backward body, for the full RopeFunction


class Fresh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k):
        return torch.empty_like(q), torch.empty_like(k)

    @staticmethod
    def backward(ctx, dq, dk):
        return dq, dk


class OurForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, options):
        return rotate(q, k, options)

    @staticmethod
    def backward(ctx, dq, dk):
        return dq, dk, None


class OurForwardAlloc(OurForward):
    @staticmethod
    def backward(ctx, dq, dk):
        return torch.empty_like(dq), torch.empty_like(dk), None


class Timed(RopeFunction):
    @staticmethod
    def backward(ctx, dq, dk=None):
        start = time.perf_counter()
        out = RopeFunction.backward(ctx, dq, dk)
        backward_s.append(time.perf_counter() - start)
        return out


variants = {
    "Function, views (bench floor)": lambda q, k: bench._Identity.apply(q, k),
    "Function, fresh outputs": lambda q, k: Fresh.apply(q, k),
    "+ our forward": lambda q, k: OurForward.apply(q, k, options),
    "+ backward allocations": lambda q, k: OurForwardAlloc.apply(q, k, options),
    "+ backward launch (RopeFunction)": lambda q, k: RopeFunction.apply(q, k, options),
    "RopeFunction, timed backward": lambda q, k: Timed.apply(q, k, options),
    "check_rope_args + RopeFunction": lambda q, k: RopeFunction.apply(
        *_checked(q, k), options),
    "apply_rope": lambda q, k: apply_rope(q, k, cos, sin),
}
if bench.liger_rope():
    variants["liger"] = bench.make_provider("liger", shape)


def _checked(q, k):
    q4, k4, _ = check_rope_args(q, k, cos, sin, kernel=KERNELS["final"])
    return q4, k4


inputs = bench.make_inputs(shape, "fwd+bwd")
steps = {name: bench.training_step(fn) for name, fn in variants.items()}
for step in steps.values():
    for _ in range(20):
        step(*inputs)
times = {name: [] for name in steps}
for _ in range(9):
    for name, step in steps.items():
        times[name].append(bench.host_us(step, inputs))
for name in steps:
    print(f"{name:36} {sorted(times[name])[4]:7.1f} us/call fwd+bwd")
print(f"inside RopeFunction.backward (median): {sorted(backward_s)[len(backward_s) // 2] * 1e6:.1f} us")

# forward alone, the same way
fwd_inputs = bench.make_inputs(shape, "fwd")
fwd = {"rotate": lambda q, k: rotate(q, k, options),
       "apply_rope": lambda q, k: apply_rope(q, k, cos, sin),
       "check_rope_args": lambda q, k: check_rope_args(q, k, cos, sin, kernel=KERNELS["final"])}
for fn in fwd.values():
    for _ in range(20):
        fn(*fwd_inputs)
ftimes = {name: sorted(bench.host_us(fn, fwd_inputs) for _ in range(9))[4] for name, fn in fwd.items()}
for name, us in ftimes.items():
    print(f"fwd {name:32} {us:7.1f} us/call")
