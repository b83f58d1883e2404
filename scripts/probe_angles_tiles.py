"""Tile-size probe for the table-free kernel (GPU): issue 26's forward gap.

    python scripts/probe_angles_tiles.py [--modes fwd fwd+bwd]

On bench-angles' shapes it replays the table kernel and the table-free kernel from CUDA
graphs (the GPU's time alone) for tiles of 512 to 4096 pairs and 1 to 8 warps a program
(``ropetut.kernels.angles.PAIRS_PER_TILE`` and ``NUM_WARPS``, which the launch key reads
at every call), and prints each as table-free ÷ table and as a share of the copy floor.
The table kernel keeps its own tuning throughout: only the table-free one is swept.
"""

import argparse
import itertools
from functools import partial

import ropetut.kernels.angles as angles
from ropetut import bench
from ropetut.bench import angles as bench_angles
from ropetut.runtime import NO_GPU, on_gpu

PAIRS = (512, 1024, 2048, 4096)
WARPS = (1, 2, 4, 8)


def graphed(name, shape, mode):
    fn = bench_angles.make_provider(name, shape)
    fn = bench.training_step(fn) if mode == "fwd+bwd" else fn
    return bench.graph_ms(fn, make_inputs=partial(bench.make_inputs, shape, mode))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(bench.MODES))
    args = parser.parse_args()
    if not on_gpu():
        print(NO_GPU)
        return
    chosen = angles.PAIRS_PER_TILE, angles.NUM_WARPS
    for shape, mode in itertools.product(bench_angles.SHAPES, args.modes):
        floor = bench.copy_floor_ms(shape, mode, graphed=True)
        table = graphed(bench_angles.TABLE, shape, mode)
        print(f"{shape.label} {mode}, CUDA graph: copy {floor:.4f} ms, "
              f"table {table:.4f} ms ({floor / table:.1%} of the floor)")  # fmt: skip
        for pairs, warps in itertools.product(PAIRS, WARPS):
            angles.PAIRS_PER_TILE, angles.NUM_WARPS = pairs, warps
            ms = graphed(bench_angles.TABLE_FREE, shape, mode)
            mark = "  <- chosen" if (pairs, warps) == chosen else ""
            print(f"  {pairs:5} pairs/tile, {warps} warps: {ms / table:.3f}x table, "
                  f"{floor / ms:6.1%} of the floor{mark}")  # fmt: skip
        angles.PAIRS_PER_TILE, angles.NUM_WARPS = chosen


if __name__ == "__main__":
    main()
