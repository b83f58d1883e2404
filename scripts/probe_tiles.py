"""Tile-size probe for the final kernel (GPU): how PAIRS_PER_TILE and NUM_WARPS were chosen.

    python scripts/probe_tiles.py

For a few benchmark shapes it replays the forward from CUDA graphs (the GPU's time alone) for
tiles of 1024 to 4096 pairs and 4 or 8 warps a program, out of place and in place, and prints
each as a share of the copy floor and as a ratio to Liger-Kernel's time (if it is installed).
"""
import itertools

import ropetut.kernels.final as final
from ropetut import bench

SHAPES = [bench.SHAPES["seed002"][0], bench.SHAPES["llama3_8b"][0], bench.SHAPES["seed001"][-1],
          bench.SHAPES["seed001"][5], bench.SHAPES["seed004"][0], bench.SHAPES["decode"][0]]
chosen = final.PAIRS_PER_TILE, final.NUM_WARPS
for shape in SHAPES:
    inputs = lambda: bench.make_inputs(shape, "fwd")   # noqa: E731
    floor = bench.graph_ms(bench.copy, make_inputs=inputs)
    liger = bench.graph_ms(bench.make_provider("liger", shape), make_inputs=inputs) if bench.liger_rope() else None
    print(f"{shape.label}, fwd, CUDA graph: copy floor {floor:.4f} ms"
          + (f", liger {floor / liger:.1%} of it" if liger else ""))
    for final.PAIRS_PER_TILE, final.NUM_WARPS in itertools.product((1024, 2048, 4096), (4, 8)):
        final._LAUNCHES.clear()
        cells = []
        for name in ("final", "final (in place)"):
            ms = bench.graph_ms(bench.make_provider(name, shape), make_inputs=inputs)
            cells.append(f"{name} {floor / ms:6.1%}" + (f" ({ms / liger:.3f}x liger)" if liger else ""))
        mark = "  <- chosen" if (final.PAIRS_PER_TILE, final.NUM_WARPS) == chosen else ""
        print(f"  {final.PAIRS_PER_TILE:5} pairs/tile, {final.NUM_WARPS} warps: " + "   ".join(cells) + mark)
final.PAIRS_PER_TILE, final.NUM_WARPS = chosen
final._LAUNCHES.clear()
