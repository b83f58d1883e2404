"""Draw the landing page's headline figure from a benchmark JSON (matplotlib only, no GPU).

    python scripts/draw_headline.py [--json results/bench_h100.json] [--out book/_static/headline.png]

The JSON is what `python -m ropetut bench --quick --json PATH` wrote. The figure says one thing:
`final` sits at the copy floor, level with Liger, far ahead of the PyTorch baseline. Four panels,
forward and forward+backward (rows) timed eagerly and replayed from CUDA graphs (columns); y is
each provider's `pct_floor` (the copy floor's time over its time, in %), x the shapes; four
providers (torch eager, torch.compile, liger, final, in the colours the chapters give them) and
the floor as a line at 100 %.

It is drawn for the book's 784 px text column: 784 px wide at its dpi, so the page shows it at
its natural size, with text of 9 pt or more (12.5 px and up).

Shapes: the quick set, except that shapes differing only in T (seed 001's sweep) count once,
at their longest T: the sweep's shorter points repeat the picture of the other shapes (the
chapters plot the whole sweep), and six groups of four bars keep the labels legible. Shapes are
ordered by the bytes they move; a label, read from the JSON's shape, is three short lines: B x T
(T in units of 1024 as "k"), the heads Hq/Hkv (one number when equal), D; and "decode" for the
shape at given positions.

Bars above 100 % are real rows of the JSON, not clipped: the floor (bench.copy) copies each
tensor in its own launch, which a one-launch kernel beats on small shapes; book/intro.md's
caption says why.
"""

import argparse
import json
import re

import matplotlib.pyplot as plt

SERIES = {"torch eager": "C0", "torch.compile": "C1", "liger": "C3", "final": "C8"}
NAMES = {"liger": "Liger-Kernel", "final": "final (this book)"}
COLUMNS = {"eager": "pct_floor", "CUDA graph": "graph_pct_floor"}

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--json", default="results/bench_h100.json")
parser.add_argument("--out", default="book/_static/headline.png")
args = parser.parse_args()
with open(args.json) as f:
    bench = json.load(f)
rows = [r for r in bench["rows"] if r["provider"] in SERIES and r["ms"]]


def parse(label):
    """'8x4096x32/8x128 bfloat16 positions' -> (8, 4096, 32, 8, 128, True)"""
    B, T, HQ, HK, D = map(
        int, re.match(r"(\d+)x(\d+)x(\d+)/(\d+)x(\d+)", label).groups()
    )
    return B, T, HQ, HK, D, "positions" in label


def moved(label):  # elements of q and k: what orders the shapes, small to large
    B, T, HQ, HK, D, _ = parse(label)
    return B * T * (HQ + HK) * D


longest = {}  # the shape without its T -> the label with the longest T
for label in dict.fromkeys(r["shape"] for r in rows):
    B, T, *rest = parse(label)
    key = (B, *rest)
    if key not in longest or T > parse(longest[key])[1]:
        longest[key] = label
shapes = sorted(longest.values(), key=moved)


def short(label):
    B, T, HQ, HK, D, positions = parse(label)
    heads = f"{HQ}" if HQ == HK else f"{HQ}/{HK}"
    tokens = f"{T // 1024}k" if T % 1024 == 0 else f"{T}"
    return f"{B}×{tokens}\n{heads}\n{D}" + ("\ndecode" if positions else "")


plt.rcParams.update(
    {"font.size": 10, "axes.titlesize": 11, "xtick.labelsize": 9, "ytick.labelsize": 10}
)
fig, axes = plt.subplots(
    2, 2, figsize=(7.84, 6.4), dpi=100, sharex=True, sharey=True, layout="constrained"
)
width = 0.8 / len(SERIES)
for ax_row, mode in zip(axes, ("fwd", "fwd+bwd")):
    for ax, (how, key) in zip(ax_row, COLUMNS.items()):
        ax.axhline(
            100, color="black", linestyle="--", linewidth=1, label="copy floor (100 %)"
        )
        for i, (name, color) in enumerate(SERIES.items()):
            mine = {
                r["shape"]: r[key]
                for r in rows
                if r["provider"] == name and r["mode"] == mode and r[key]
            }
            xs = [j for j, s in enumerate(shapes) if s in mine]
            ax.bar(
                [x + (i - (len(SERIES) - 1) / 2) * width for x in xs],
                [mine[shapes[x]] for x in xs],
                width,
                color=color,
                label=NAMES.get(name, name),
            )
        ax.set_title(f"{'forward' if mode == 'fwd' else 'forward + backward'}, {how}")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    ax_row[0].set_ylabel("% of the copy floor")
for ax in axes[-1]:
    ax.set_xticks(range(len(shapes)), [short(s) for s in shapes])
    ax.set_xlabel("shape: B×T, heads Hq/Hkv, D")
handles, labels = axes[0, 0].get_legend_handles_labels()
fig.legend(
    handles,
    labels,
    loc="outside lower center",
    ncols=len(labels),
    frameon=False,
    fontsize=9,
    handlelength=1.5,
    columnspacing=1,
)
fig.suptitle(f"RoPE on {bench['environment']['device']}: higher is faster", fontsize=11)
fig.savefig(args.out, dpi=100)
print(
    f"wrote {args.out}: {len(shapes)} shapes, {len(SERIES)} providers, from {args.json}"
)
