"""Python host time per call of the table path and the table-free path, launches stubbed
out (CPU): what each path's own Python costs, apart from any kernel.

    python scripts/host_stubbed_launch.py [--profile]

``apply_rope`` (``final``, with tables) and ``apply_rope_angles``, forward alone and a
forward+backward step, on one small plain call (1 x 16 tokens, 4/2 heads of 64,
float32). Each launch runs once through Triton's interpreter; then the kept launches
are replaced by a no-op, so the timed calls run every line of Python but the kernel.
Prints the median of 5 rounds of 2,000 calls, in microseconds; --profile adds
cProfile's top entries of each step. On a CPU only (it stubs CUDA's stream and device
queries), and noisy on a small machine: rounds of one tree spread by up to 20 %.
A GPU's eager times add the launches, and run the backward on autograd's own thread.
"""

# ruff: noqa: I001
import argparse
import cProfile
import pstats
import statistics
import time

# ropetut first: on a machine without a GPU it switches Triton to its interpreter
import ropetut
import torch
from ropetut import apply_rope, apply_rope_angles
from ropetut.kernels import final
from ropetut.kernels import launch as kept
from ropetut.tables import rope_tables, standard

B, T, HQ, HK, D = 1, 16, 4, 2, 64


class NoLaunch:
    """A compiled kernel's stand-in: launching it does nothing."""

    function = None
    packed_metadata = None

    def run(self, *args):
        pass


def stub_launches():
    """Every launch from here on is kept and a no-op: final's cache and launch.py's."""
    torch._C._cuda_getDevice = lambda: -1  # a CPU tensor's get_device()
    torch._C._cuda_getCurrentRawStream = lambda device: 0
    first_launch = final._first_launch

    def first(*args, **kwargs):
        _, grid, scalars = first_launch(*args, **kwargs)  # runs the interpreter once
        return NoLaunch(), grid, scalars

    final._first_launch = first
    final.direct_launch_matches = lambda: True


def per_call_us(fn, n=2000):
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if ropetut.on_gpu():
        raise SystemExit("host_stubbed_launch.py runs on a CPU (it stubs CUDA queries)")
    stub_launches()
    q, k = torch.randn(B, T, HQ, D), torch.randn(B, T, HK, D)
    cos, sin = rope_tables(standard(D), T)
    inv_freq = standard(D).float()
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    gq, gk = torch.randn_like(q), torch.randn_like(k)

    def step(outs):
        torch.autograd.backward(outs, (gq, gk))

    calls = {
        "table fwd": lambda: apply_rope(q, k, cos, sin),
        "table-free fwd": lambda: apply_rope_angles(q, k, inv_freq),
        "table fwd+bwd": lambda: step(apply_rope(qg, kg, cos, sin)),
        "table-free fwd+bwd": lambda: step(apply_rope_angles(qg, kg, inv_freq)),
    }
    for fn in calls.values():
        fn()  # each launch once, through the interpreter
    for launch in kept._KEPT.values():
        launch.compiled, launch.device = NoLaunch(), -1
    for name, fn in calls.items():
        us = statistics.median(per_call_us(fn) for _ in range(5))
        print(f"{name:20} {us:6.1f} us a call")
    if args.profile:
        for name in ("table fwd+bwd", "table-free fwd+bwd"):
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(500):
                calls[name]()
            profile.disable()
            stats = pstats.Stats(profile)
            print(f"== {name}: {stats.total_calls / 500:.0f} Python calls a step")
            stats.sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
