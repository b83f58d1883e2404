"""Tile-size probe for the table-free kernel (GPU): issue 26's forward gap.

    python scripts/probe_angles_tiles.py [--modes fwd fwd+bwd] [--tiles 1024/2 512/8]
        [--repeats 3] [--turns division|product] [--angle exact|long|fp32|none]

On bench-angles' shapes it replays the table kernel and the table-free kernel from CUDA
graphs (the GPU's time alone) for tiles of 512 to 4096 pairs and 1 to 8 warps a program
(``ropetut.kernels.angles.PAIRS_PER_TILE`` and ``NUM_WARPS``, and the same for one short
wave's ``SHORT_WAVE_PAIRS_PER_TILE`` and ``SHORT_WAVE_NUM_WARPS``, which the launch key
reads at every call), and prints each as table-free ÷ table and as a share of the copy
floor; "<- chosen" marks the module's tile for the kind of grid the shape launches.
The table kernel keeps its own tuning throughout: only the table-free one is swept.

--tiles: only these pairs/warps (default: every pair of 512 to 4096 and 1 to 8).
--repeats: each time the median of this many rounds, the tiles taking turns in each
    round (the first run, on 2026-11-28, was one round, and one of its rows disagreed
    with bench-angles' median of 3 at the same tile).
--turns division: the kernel before 2026-11-28, which divided inv_freq by 2pi in fp64
    where it now multiplies by 1/2pi (sm_90 SASS at decode: 704 against 608
    instructions; results/probe_angles_turns_h200.txt timed both). It replaces
    ``angles._turns_per_position`` in this process before anything compiles, so Triton
    compiles (and caches) that variant under a key of its own.
--angle long: the long path (three position parts and 12-bit words,
    ``angles._fraction_of_turns_long``) in every program, as the kernel took before
    2026-12-01, where it now takes one product and its exact error in a program whose
    positions are all below 2**24.
--loads-first never: no launch loads q and k ahead of the angles (``LOADS_FIRST``
    off in every plan), for what the loads ahead buy in one short wave (decode).
--head-split never: no launch splits a tile's blocks of heads between programs
    (``HEAD_SPLIT`` 1 and the grid's third axis 1 in every plan), for what the split
    buys where one short wave leaves SMs over.
--shapes: only these shapes, each bench-angles' label (64x1x32/8x128, ...) or
    B,T,HQ,HK,D with ",p" for decode's positions (64,1,64,8,128,p: 64 heads), in
    place of bench-angles' six.
--angle fp32 | none: what the exact angle costs, by leaving it out (wrong outputs,
    the same loads and stores): fp32 takes p * inv_freq / 2pi as one float32 product
    (the naive angle, then the same polynomials); none computes no angle at all (a
    conversion in place of each step). Exact minus fp32 is the price of exactness;
    fp32 minus none, the polynomials'; none against the table, the kernel's structure.
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
MODULE_PLAN = angles._plan  # before --loads-first replaces it
WARPS = (1, 2, 4, 8)


@triton.jit
def _turns_by_division(inv_freq):
    """inv_freq / 2pi as one fp64 division: --turns division."""
    return inv_freq.to(tl.float64) / tl.full((), 2 * math.pi, tl.float64)


@triton.jit
def _turns_only_converted(inv_freq):
    """--angle none: inv_freq as it is, in fp64 (no product)."""
    return inv_freq.to(tl.float64)


@triton.jit
def _fraction_in_float32(c, pos):
    """--angle fp32: position * c as one float32 product, reduced (the naive angle)."""
    turns = pos.to(tl.float32) * c.to(tl.float32)
    return turns - tl.floor(turns + 0.5), tl.zeros_like(turns)


@triton.jit
def _fraction_left_out(c, pos):
    """--angle none: no product, no reduction."""
    turns = pos.to(tl.float32) + c.to(tl.float32)
    return turns, tl.zeros_like(turns)


@triton.jit
def _cos_sin_left_out(turn, lo):
    """--angle none: no polynomials."""
    return turn, lo


ANGLE_VARIANTS = {  # --angle: the kernel's functions replaced, by name (one short
    # wave calls the short path's own function)
    "exact": {},
    "long": {
        "_fraction_of_turns": angles._fraction_of_turns_long,
        "_fraction_of_turns_short": angles._fraction_of_turns_long,
    },
    "fp32": {
        "_fraction_of_turns": _fraction_in_float32,
        "_fraction_of_turns_short": _fraction_in_float32,
    },
    "none": {
        "_turns_per_position": _turns_only_converted,
        "_fraction_of_turns": _fraction_left_out,
        "_fraction_of_turns_short": _fraction_left_out,
        "_cos_sin_of_turn": _cos_sin_left_out,
    },
}


def graphed(name, shape, mode):
    fn = bench_angles.make_provider(name, shape)
    fn = bench.training_step(fn) if mode == "fwd+bwd" else fn
    return bench.graph_ms(fn, make_inputs=partial(bench.make_inputs, shape, mode))


def never_loads_first(plan_of):
    """--loads-first never: ``angles._plan`` with LOADS_FIRST (the last constexpr)
    off."""

    def plan(*args):
        made = plan_of(*args)
        return made._replace(args=(*made.args[:-1], False))

    return plan


def never_head_split(plan_of):
    """--head-split never: ``angles._plan`` with HEAD_SPLIT (the constexpr before
    LOADS_FIRST) 1, and one program along the grid's third axis."""

    def plan(*args):
        made = plan_of(*args)
        x, y, _ = made.grid
        return made._replace(grid=(x, y, 1), args=(*made.args[:-2], 1, made.args[-1]))

    return plan


def shape_of(text):
    """A bench-angles label, or 'B,T,HQ,HK,D' with ',p' for positions."""
    for shape in bench_angles.SHAPES:
        if text == shape.label.split()[0]:  # 64x1x32/8x128
            return shape
    *sizes, last = text.split(",")
    positions = last == "p"
    sizes = [int(n) for n in (sizes if positions else [*sizes, last])]
    return bench.Shape(*sizes, positions=positions)


def one_short_wave(shape):
    """Whether the kernel's launch at shape is one short wave (``angles._plan``), with
    the module's tiles."""
    q = bench.make_inputs(shape, "fwd")[0]
    plan = MODULE_PLAN(q, q, q, q, q, q, False, False, shape.D, False, False)
    return plan.args[-1]  # the last constexpr: LOADS_FIRST


def tile(text):
    """'1024/2' -> (1024, 2)."""
    pairs, warps = text.split("/")
    return int(pairs), int(warps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(bench.MODES))
    parser.add_argument("--tiles", nargs="+", type=tile)  # (a repeat is timed twice)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--turns", choices=("division", "product"), default="product")
    parser.add_argument("--angle", choices=tuple(ANGLE_VARIANTS), default="exact")
    parser.add_argument("--loads-first", choices=("auto", "never"), default="auto")
    parser.add_argument("--head-split", choices=("auto", "never"), default="auto")
    parser.add_argument("--shapes", nargs="+", type=shape_of)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: at least 1, got {args.repeats}")
    if not on_gpu():
        print(NO_GPU)
        return
    if args.turns == "division":
        angles._turns_per_position = _turns_by_division
    for name, replacement in ANGLE_VARIANTS[args.angle].items():
        setattr(angles, name, replacement)
    if args.loads_first == "never":
        angles._plan = never_loads_first(angles._plan)
    if args.head_split == "never":
        angles._plan = never_head_split(angles._plan)
    chosen = angles.PAIRS_PER_TILE, angles.NUM_WARPS
    chosen_short = angles.SHORT_WAVE_PAIRS_PER_TILE, angles.SHORT_WAVE_NUM_WARPS
    tiles = args.tiles or list(itertools.product(PAIRS, WARPS))
    print(f"turns by {args.turns}, angle {args.angle}, loads first "
          f"{args.loads_first}, head split {args.head_split}; medians of "
          f"{args.repeats} round(s)")  # fmt: skip
    shapes = args.shapes or bench_angles.SHAPES
    for shape, mode in itertools.product(shapes, args.modes):
        floor = bench.copy_floor_ms(shape, mode, graphed=True)
        rounds = {t: [] for t in ["table", *tiles]}
        for _ in range(args.repeats):
            rounds["table"].append(graphed(bench_angles.TABLE, shape, mode))
            for pairs, warps in tiles:  # the same tile for either kind of grid
                angles.PAIRS_PER_TILE, angles.NUM_WARPS = pairs, warps
                angles.SHORT_WAVE_PAIRS_PER_TILE = pairs
                angles.SHORT_WAVE_NUM_WARPS = warps
                ms = graphed(bench_angles.TABLE_FREE, shape, mode)
                rounds[pairs, warps].append(ms)
            angles.PAIRS_PER_TILE, angles.NUM_WARPS = chosen
            angles.SHORT_WAVE_PAIRS_PER_TILE, angles.SHORT_WAVE_NUM_WARPS = chosen_short
        table = statistics.median(rounds.pop("table"))
        print(f"{shape.label} {mode}, CUDA graph: copy {floor:.4f} ms, "
              f"table {table:.4f} ms ({floor / table:.1%} of the floor)")  # fmt: skip
        short = one_short_wave(shape)
        for (pairs, warps), times in rounds.items():
            ms = statistics.median(times)
            mine = chosen_short if short else chosen
            mark = "  <- chosen" if (pairs, warps) == mine else ""
            print(f"  {pairs:5} pairs/tile, {warps} warps: {ms / table:.3f}x table, "
                  f"{floor / ms:6.1%} of the floor{mark}")  # fmt: skip


if __name__ == "__main__":
    main()
