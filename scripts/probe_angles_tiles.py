"""Tile-size probe for the table-free kernel (GPU): issue 26's forward gap.

    python scripts/probe_angles_tiles.py [--modes fwd fwd+bwd] [--tiles 1024/2 512/8]
        [--repeats 3] [--turns division|product]

On bench-angles' shapes it replays the table kernel and the table-free kernel from CUDA
graphs (the GPU's time alone) for tiles of 512 to 4096 pairs and 1 to 8 warps a program
(``ropetut.kernels.angles.PAIRS_PER_TILE`` and ``NUM_WARPS``, which the launch key reads
at every call), and prints each as table-free ÷ table and as a share of the copy floor.
The table kernel keeps its own tuning throughout: only the table-free one is swept.

--tiles: only these pairs/warps (default: every pair of 512 to 4096 and 1 to 8).
--repeats: each time the median of this many rounds, the tiles taking turns in each
    round (the first run, on 2026-11-28, was one round, and one of its rows disagreed
    with bench-angles' median of 3 at the same tile).
--turns product: a candidate, measured before it goes into the kernel. Each program
    computes inv_freq / 2pi as one fp64 product by 1/(2pi) instead of one fp64 division
    (the same 1e-16 relative size of rounding; sm_90 SASS at decode: 704 -> 608
    instructions, the division's slow-path CALL and its MUFU gone). It replaces
    ``angles._turns_per_position`` in this process before anything compiles, so Triton
    compiles (and caches) that variant under a key of its own.
"""

# ruff: noqa: I001
import argparse
import itertools
import math
import statistics
from functools import partial

# ropetut first: on a machine without a GPU it switches Triton to its interpreter
import ropetut.kernels.angles as angles
import triton
import triton.language as tl
from ropetut import bench
from ropetut.bench import angles as bench_angles
from ropetut.runtime import NO_GPU, on_gpu

PAIRS = (512, 1024, 2048, 4096)
WARPS = (1, 2, 4, 8)


@triton.jit
def _turns_by_product(inv_freq):
    """inv_freq / 2pi as one fp64 product by fp64(1 / 2pi): --turns product."""
    return inv_freq.to(tl.float64) * tl.full((), 1 / (2 * math.pi), tl.float64)


def graphed(name, shape, mode):
    fn = bench_angles.make_provider(name, shape)
    fn = bench.training_step(fn) if mode == "fwd+bwd" else fn
    return bench.graph_ms(fn, make_inputs=partial(bench.make_inputs, shape, mode))


def tile(text):
    """'1024/2' -> (1024, 2)."""
    pairs, warps = text.split("/")
    return int(pairs), int(warps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(bench.MODES))
    parser.add_argument("--tiles", nargs="+", type=tile)  # (a repeat is timed twice)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--turns", choices=("division", "product"), default="division")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: at least 1, got {args.repeats}")
    if not on_gpu():
        print(NO_GPU)
        return
    if args.turns == "product":
        angles._turns_per_position = _turns_by_product
    chosen = angles.PAIRS_PER_TILE, angles.NUM_WARPS
    tiles = args.tiles or list(itertools.product(PAIRS, WARPS))
    print(f"turns by {args.turns}; medians of {args.repeats} round(s)")
    for shape, mode in itertools.product(bench_angles.SHAPES, args.modes):
        floor = bench.copy_floor_ms(shape, mode, graphed=True)
        rounds = {t: [] for t in ["table", *tiles]}
        for _ in range(args.repeats):
            rounds["table"].append(graphed(bench_angles.TABLE, shape, mode))
            for pairs, warps in tiles:
                angles.PAIRS_PER_TILE, angles.NUM_WARPS = pairs, warps
                ms = graphed(bench_angles.TABLE_FREE, shape, mode)
                rounds[pairs, warps].append(ms)
            angles.PAIRS_PER_TILE, angles.NUM_WARPS = chosen
        table = statistics.median(rounds.pop("table"))
        print(f"{shape.label} {mode}, CUDA graph: copy {floor:.4f} ms, "
              f"table {table:.4f} ms ({floor / table:.1%} of the floor)")  # fmt: skip
        for (pairs, warps), times in rounds.items():
            ms = statistics.median(times)
            mark = "  <- chosen" if (pairs, warps) == chosen else ""
            print(f"  {pairs:5} pairs/tile, {warps} warps: {ms / table:.3f}x table, "
                  f"{floor / ms:6.1%} of the floor{mark}")  # fmt: skip


if __name__ == "__main__":
    main()
