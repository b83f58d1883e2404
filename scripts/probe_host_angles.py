"""Host time per call of the table path and the table-free path on the GPU (issue 26's
eager forward+backward rows that the host paces).

    python scripts/probe_host_angles.py [--rounds 9] [--profile]

``apply_rope`` with tables against ``apply_rope_angles``, forward alone and
forward+backward (``torch.autograd.grad``), on ``bench.HOST_SHAPE``: the two paths take
turns, round by round, and each prints its median round in microseconds a call and its
ratio to the table's. --profile adds cProfile's top entries of each forward+backward,
by own time. ``scripts/host_stubbed_launch.py`` measures the same Python on a CPU,
launches stubbed out; this adds the launches and autograd's GPU thread.
"""

import argparse
import cProfile
import pstats
import statistics

import torch

from ropetut import apply_rope, apply_rope_angles, bench, on_gpu
from ropetut.tables import rope_tables, standard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if not on_gpu():
        raise SystemExit("probe_host_angles.py times the GPU's host path: run it on one")
    shape = bench.HOST_SHAPE
    inv_freq = standard(shape.D).float().cuda()
    cos, sin = rope_tables(inv_freq, shape.T, device="cuda")
    paths = {
        "table": lambda q, k: apply_rope(q, k, cos, sin),
        "table-free": lambda q, k: apply_rope_angles(q, k, inv_freq),
    }
    for mode in bench.MODES:
        inputs = bench.make_inputs(shape, mode)
        calls = {
            name: fn if mode == "fwd" else bench.training_step(fn)
            for name, fn in paths.items()
        }
        for fn in calls.values():
            for _ in range(20):  # compiles, keeps the launch, warms up
                fn(*inputs)
        rounds = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                rounds[name].append(bench.host_us(fn, inputs))
        table = statistics.median(rounds["table"])
        for name, us in rounds.items():
            median = statistics.median(us)
            print(f"{mode:8} {name:11} {median:7.1f} us a call  {median / table:.3f}x")
        if args.profile and mode != "fwd":
            for name, fn in calls.items():
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(300):
                    fn(*inputs)
                torch.cuda.synchronize()
                profile.disable()
                print(f"== {name} {mode}, 300 calls, by own time")
                pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
