"""Benchmark rows for issue 26: table-free RoPE against the table kernel it replaces.

``python -m ropetut bench-angles [--json PATH] [--runs N]`` times, on each of
``SHAPES``, side by side in one process, eager and from CUDA graphs, fwd and fwd+bwd:

- ``table-free``: ``apply_rope_angles``, each angle computed in the kernel from
  ``inv_freq`` and the token's position;
- ``final (table)``: ``apply_rope`` reading precomputed cos/sin rows;
- ``copy (floor)``: ``bench.copy`` of q and k (fwd+bwd: of the gradients too).

Each row is the median of ``--runs`` passes over every shape (3 by default; a pass
times each provider once, so a slow moment of the GPU lands on all of them), and keeps
each pass's times. ``ratio`` is table-free ÷ table: the median of each pass's ratio,
kept per pass as ``ratio_runs`` (graphed: ``graph_ratio``, ``graph_ratio_runs``).
Eagerly, the two rows of a pass are timed in turn, call by call
(``bench.interleaved_ms``): the eager time of a host-paced row drifts by more than the
kernels differ, and one after the other was not close enough (2026-12-03, on the H200,
4x4096 fwd+bwd: the table's seven passes took 0.19 to 0.41 ms, and the passes' ratios
ranged 0.52 to 1.29: results/bench_angles_h200.json at f17adb9e). Decode reads
positions near 2**20: the table holds 2**20 + 4096 rows there (512 MiB of fp32 cos
and sin), which is the case table-free exists for. Without a GPU nothing is timed.
"""

import argparse
import json
import statistics
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import bench
from ..angles import apply_rope_angles
from ..autograd import apply_rope
from ..runtime import DEVICE, NO_GPU, on_gpu
from ..tables import rope_tables, standard

TABLE_FREE, TABLE = "table-free", "final (table)"
PROVIDERS = (bench.COPY, TABLE, TABLE_FREE)
SHAPES = [
    bench.Shape(4, 4096, 32, 8, 128),
    bench.Shape(1, 32768, 32, 8, 128),
    bench.Shape(8, 4096, 32, 8, 128),
    bench.Shape(4, 2048, 8, 8, 128),
    bench.Shape(1, 131072, 32, 8, 128),
    # decode: 64 sequences, one token each, at positions near 2**20
    bench.Shape(64, 1, 32, 8, 128, positions=True),
]
DECODE_FIRST_POSITION = 2**20


def make_provider(name: str, shape: bench.Shape):
    """``fn(q, k) -> (q_out, k_out)`` on (B, T, H, D) tensors; frequencies, table and
    positions are built here, untimed."""
    inv_freq = standard(shape.D).float().to(DEVICE)
    if shape.positions:  # the same positions for every provider
        first = DECODE_FIRST_POSITION
        draw = torch.Generator().manual_seed(0)
        pos = torch.randint(
            first, first + bench.N_POSITIONS, (shape.B, shape.T), generator=draw
        )
        pos, n_rows = pos.to(DEVICE), first + bench.N_POSITIONS
    else:
        pos, n_rows = None, shape.T
    if name == TABLE_FREE:
        return lambda q, k: apply_rope_angles(q, k, inv_freq, positions=pos)
    if name == TABLE:
        cos, sin = rope_tables(inv_freq, n_rows)
        return lambda q, k: apply_rope(q, k, cos=cos, sin=sin, positions=pos)
    raise ValueError(f"name: must be one of {PROVIDERS[1:]}, got {name!r}")


def paired_eager_ms(shape: bench.Shape, mode: str) -> dict:
    """{TABLE: ms, TABLE_FREE: ms}: their eager times, timed in turn call by call; {}
    if either raises (``bench.measure`` then times it alone and records the error)."""
    fns = [make_provider(name, shape) for name in (TABLE, TABLE_FREE)]
    if mode != "fwd":
        fns = [bench.training_step(fn) for fn in fns]
    try:
        times = bench.interleaved_ms(
            fns, make_inputs=partial(bench.make_inputs, shape, mode)
        )
    except Exception:
        return {}
    return dict(zip((TABLE, TABLE_FREE), times))


def one_pass(shapes, modes, bar) -> list:
    """Every provider on every shape and mode once, the copy floor first."""
    rows = []
    for shape in shapes:
        for mode in modes:
            floor_ms = bench.copy_floor_ms(shape, mode)
            graph_floor_ms = bench.copy_floor_ms(shape, mode, graphed=True)
            eager = paired_eager_ms(shape, mode)
            for name in PROVIDERS:
                bar.set_description(f"{shape.label} {mode} {name}")
                rows.append(
                    bench.measure(
                        name, shape, mode, floor_ms, graph_floor_ms, make_provider,
                        eager_ms=eager.get(name),
                    )  # fmt: skip
                )
                bar.update()
    return rows


def median_rows(passes: list) -> list:
    """One row per (shape, mode, provider): the median of each time over the passes,
    % of floor from the median times, every pass's times kept, and for table-free
    its ratio to the table: the median of each pass's ratio."""
    rows = []
    for same in zip(*passes):
        row = dict(same[0])
        errors = [r["error"] for r in same if r["error"]]
        row["error"] = errors[0] if errors else None
        for prefix in ("", "graph_"):
            times = [r[prefix + "ms"] for r in same]
            row[prefix + "runs_ms"] = times
            row[prefix + "ms"] = None if errors else statistics.median(times)
        # the same bytes over the median time
        row["gbps"] = same[0]["gbps"] * same[0]["ms"] / row["ms"] if row["ms"] else None
        rows.append(row)
    for prefix in ("", "graph_"):
        floor = {
            (r["shape"], r["mode"]): r[prefix + "ms"]
            for r in rows
            if r["provider"] == bench.COPY
        }
        table = {
            (r["shape"], r["mode"]): r for r in rows if r["provider"] == TABLE
        }
        for r in rows:  # None where a time is missing (an error in some pass)
            key, ms = (r["shape"], r["mode"]), r[prefix + "ms"]
            r[prefix + "pct_floor"] = (
                floor[key] / ms * 100 if ms and floor[key] else None
            )
            other = table.get(key) or {}
            paired = r["provider"] == TABLE_FREE and ms and other.get(prefix + "ms")
            # each pass's ratio of times taken one after the other, then their median
            runs = None
            if paired:
                pairs = zip(r[prefix + "runs_ms"], other[prefix + "runs_ms"])
                runs = [a / b for a, b in pairs]
            r[prefix + "ratio_runs"] = runs
            r[prefix + "ratio"] = statistics.median(runs) if runs else None
            r[prefix + "vs_liger"] = None  # bench.format_table's column
    return rows


def run(shapes=SHAPES, modes=bench.MODES, runs=3):
    """``runs`` passes, then their medians. Returns the rows, or None without a GPU."""
    if not on_gpu():
        print(NO_GPU)
        return None
    with tqdm(total=runs * len(shapes) * len(modes) * len(PROVIDERS)) as bar:
        passes = [one_pass(shapes, modes, bar) for _ in range(runs)]
    return median_rows(passes)


def format_ratios(rows) -> str:
    """table-free ÷ table, eager and graphed, one line per shape and mode."""
    lines = [f"{'shape':37} {'mode':7} {'eager':>6} {'graph':>6}"]
    for r in rows:
        if r["provider"] == TABLE_FREE:
            cells = [
                "     -" if r[p + "ratio"] is None else f"{r[p + 'ratio']:6.3f}"
                for p in ("", "graph_")
            ]
            lines.append(f"{r['shape']:37} {r['mode']:7} {' '.join(cells)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ropetut bench-angles", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", metavar="PATH", help="write {environment, rows} here")
    parser.add_argument("--runs", type=int, default=3, help="passes to take medians of")
    args = parser.parse_args(argv)
    rows = run(runs=args.runs)
    if rows is None:
        return 0
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps({"environment": bench.environment(), "rows": rows}, indent=1)
        )
    bench.print_table(rows)
    print(format_ratios(rows))
    return 1 if any(r["error"] and r["provider"] == TABLE_FREE for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
