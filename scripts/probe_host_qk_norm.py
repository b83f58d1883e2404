"""Where the fused QK-norm's fwd+bwd host time goes (GPU): issue 25's eager gap.

    python scripts/probe_host_qk_norm.py [--steps 500] [--top 20]

On ``bench.HOST_SHAPE`` (the GPU waits for the host), each provider's fwd+bwd step of
``bench.qk_norm.host_rows`` (``torch.autograd.grad`` to q, k, w_q and w_k): its host
microseconds a step (median of 5 rounds, providers taking turns), beside an
autograd.Function that allocates its outputs and gradients and launches nothing (what
any custom Function costs a step here); then each provider's step under cProfile, the
functions that hold most of its own time. Chapter 06b measured the fused fwd+bwd
host-paced on every shape on the H200 (0.66 to 0.87 ms eager against 0.014 to 0.50 ms
graphed): this says which part of the host's step to cut.

Then the least any autograd.Function can take there: on the first shape of
``bench.qk_norm.SHAPES``, the eager fwd+bwd ms of the fused step, of the Function that
launches nothing, of one that also launches one empty kernel each way (straight to
the compiled kernel, as ropetut's launches go), and of one that launches the fused
kernels with the least Python around them (``Bare``: no checks, options fixed ahead,
the launchers called with their keys), taking turns (``bench.interleaved_ms``), and
each as % of the 5U byte floor (bench-qk-norm's ``pct_floor``). ``Bare`` bounds what
cutting ropetut's own host time could still give.
"""

# ruff: noqa: I001
import argparse
import cProfile
import pstats
import statistics
from functools import partial

# ropetut first: on a machine without a GPU it switches Triton to its interpreter
from ropetut import bench
from ropetut.bench import qk_norm as bench_qk_norm
from ropetut.kernels import qk_norm_rope
from ropetut.kernels.launch import Plan, kept_launch, launch
from ropetut.runtime import DEVICE, NO_GPU, on_gpu
from ropetut.tables import rope_tables, standard
import torch
import triton


class Allocates(torch.autograd.Function):
    """Outputs and gradients allocated as the fused Function's are; nothing launched."""

    @staticmethod
    def forward(ctx, q, k, w_q, w_k):
        ctx.save_for_backward(q, k, w_q, w_k)
        return torch.empty_like(q), torch.empty_like(k)

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        q, k, w_q, w_k = ctx.saved_tensors
        return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(w_q),
                torch.empty_like(w_k))  # fmt: skip


@triton.jit
def _nothing(x_ptr):
    pass


def launch_nothing(x):
    """One launch of a kernel that does nothing, the way ropetut's kernels launch."""
    kept = kept_launch(_nothing, "probe", lambda: Plan((1, 1, 1), (), 1))
    launch(_nothing, kept, (x,))


class Launches(Allocates):
    """``Allocates``, and one empty kernel launched forward and one backward."""

    @staticmethod
    def forward(ctx, q, k, w_q, w_k):
        outs = Allocates.forward(ctx, q, k, w_q, w_k)
        launch_nothing(q)
        return outs

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        grads = Allocates.backward(ctx, dq_out, dk_out)
        launch_nothing(dq_out)
        return grads


class Bare(torch.autograd.Function):
    """The fused kernels and nothing else: ``fixed`` holds the tables, the launchers'
    options and both launch keys, made once per shape (``bare``)."""

    @staticmethod
    def forward(ctx, q, k, w_q, w_k, fixed):
        cos, sin, options, forward_key, backward_key = fixed
        ctx.save_for_backward(q, k, w_q, w_k)
        ctx.fixed = fixed
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        qk_norm_rope.qk_norm_rope_forward(
            q, k, w_q, w_k, cos, sin, q_out, k_out, key=forward_key, **options
        )
        return q_out, k_out

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        q, k, w_q, w_k = ctx.saved_tensors
        cos, sin, options, _, backward_key = ctx.fixed
        grads = qk_norm_rope.qk_norm_rope_backward(
            q, k, w_q, w_k, cos, sin, dq_out, dk_out, key=backward_key, **options
        )
        return (*grads, None)


def bare(shape, weights):
    """``Bare`` at shape: fn(q, k), tables as ``make_provider`` builds them."""
    cos, sin = rope_tables(standard(shape.D), shape.T, device=DEVICE)
    options = dict(positions=None, eps=bench_qk_norm.EPS, interleaved=False,
                   rotary_dim=shape.D, weight_offset=0.0)  # fmt: skip
    tunings = (qk_norm_rope.FORWARD, qk_norm_rope.BACKWARD)
    keys = [("probe: bare", shape.label, tuning) for tuning in tunings]
    fixed = (cos, sin, options, *keys)
    return lambda q, k: Bare.apply(q, k, *weights, fixed)


EMPTY, LAUNCHES = "autograd.Function, empty", "autograd.Function, 2 launches"
BARE = "autograd.Function, bare kernels"


def steps(shape):
    """name -> (fwd+bwd step, its inputs), each provider as ``host_rows`` builds it."""
    out = {}
    names = (bench_qk_norm.FUSED, bench_qk_norm.LIGER, EMPTY, LAUNCHES, BARE)
    for name in names:
        if name == bench_qk_norm.LIGER and bench_qk_norm.liger_pair() is None:
            print(f"{name}: {bench_qk_norm.NO_LIGER}")
            continue
        if name in (bench_qk_norm.FUSED, bench_qk_norm.LIGER):
            fn, weights = bench_qk_norm.make_provider(name, shape)
        elif name == BARE:
            _, weights = bench_qk_norm.make_provider(bench_qk_norm.FUSED, shape)
            fn = bare(shape, weights)
        else:
            _, weights = bench_qk_norm.make_provider(bench_qk_norm.FUSED, shape)
            function = Allocates if name == EMPTY else Launches
            fn = lambda q, k, w=weights, f=function: f.apply(q, k, *w)  # noqa: E731
        out[name] = (bench_qk_norm.training_step(fn, weights),
                     bench.make_inputs(shape, "fwd+bwd"))  # fmt: skip
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    if not on_gpu():
        print(NO_GPU)
        return
    shape = bench.HOST_SHAPE
    providers = steps(shape)
    for step, inputs in providers.values():
        for _ in range(20):  # compile, fill the launch caches
            step(*inputs)
    rounds = {name: [] for name in providers}
    for _ in range(5):
        for name, (step, inputs) in providers.items():
            rounds[name].append(bench.host_us(step, inputs))
    print(f"{shape.label}, fwd+bwd, host µs a step (median of 5 rounds):")
    for name, times in rounds.items():
        print(f"  {name:28} {statistics.median(times):8.1f}")
    for name, (step, inputs) in providers.items():
        profile = cProfile.Profile()
        torch.cuda.synchronize()
        profile.enable()
        for _ in range(args.steps):
            step(*inputs)
        torch.cuda.synchronize()
        profile.disable()
        print(f"\n== {name}: {args.steps} steps under cProfile, by own time")
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
    least(bench_qk_norm.SHAPES[0])


def least(shape):
    """Eager fwd+bwd ms and % of the 5U floor: fused against the Functions doing no
    work, taking turns."""
    names, built = (bench_qk_norm.FUSED, BARE, EMPTY, LAUNCHES), steps(shape)
    fns = [built[name][0] for name in names]
    make = partial(bench.make_inputs, shape, "fwd+bwd")
    floor = bench.copy_floor_ms(shape, "fwd+bwd") * bench_qk_norm.BYTE_FLOOR_OVER_COPY[
        "fwd+bwd"
    ]
    print(f"\n{shape.label}, fwd+bwd eager, taking turns; 5U floor {floor:.3f} ms")
    for name, ms in zip(names, bench.interleaved_ms(fns, make_inputs=make)):
        print(f"  {name:32} {ms:7.3f} ms  {100 * floor / ms:4.0f} % of the floor")


if __name__ == "__main__":
    main()
