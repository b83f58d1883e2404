"""Issue 27's verdict table so far, from the stored runs and the committed margins.

    python scripts/study_verdicts.py [--runs results/training_h100/study]
        [--margins results/training_h100_margins.json] [--out PATH]

Applies ``ropetut.training.verdicts.comparison_verdicts`` to the runs and writes a
Markdown table (to stdout, or to ``--out``): per comparison, the seeds, the mean of
b - a with its 95 % paired interval, the margin, the verdict, and for comparisons with
a seed number the relative gap against the seed's. Then the comparisons still waiting
for runs. Every figure is read from the runs' JSON; nothing trains.
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ropetut.training.train import load_runs  # noqa: E402
from ropetut.training.verdicts import comparison_verdicts  # noqa: E402


def table(runs, margins) -> str:
    rows, missing = comparison_verdicts(runs, margins)
    commits = sorted({r["environment"]["ropetut commit"][:10] for r in runs})
    names = sorted({r["environment"]["device"] for r in runs})
    device = " and ".join(names) if runs else "no device (no runs yet)"
    lines = [
        f"# Issue 27's verdicts so far ({len(runs)} runs)",
        "",
        f"Written by `scripts/study_verdicts.py` from the runs' JSON, on {device}"
        f" (ropetut {', '.join(commits)}), and the margins committed before the first"
        " run (`results/training_h100_margins.json`). b - a is paired by seed, with its"
        " 95 % t interval; the verdict is `ropetut.training.stats.verdict`'s. The"
        " relative gap is (b - a) / a against the seed's own, which counts as come"
        " back when our interval overlaps [seed / 2, 2 x seed].",
        "",
        "| comparison | a → b | measure | seeds | b - a [95 %] | margin | verdict "
        "| relative gap [95 %] vs seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gap = ""
        if "seed_gap" in r:
            g = r["seed_gap"]
            o = g["ours"]
            gap = (
                f"{o['mean']:+.3f} [{o['low']:+.3f}, {o['high']:+.3f}] vs "
                f"{g['seed']:+.3f}: {g['verdict']}"
            )
        lines.append(
            f"| `{r['id']}` | {r['a']} → {r['b']} | {r['measure']} | {r['seeds']} "
            f"| {r['mean']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}] "
            f"| ±{r['margin']} | **{r['verdict']}** | {gap} |"
        )
    waiting = ", ".join(f"`{m}`" for m in missing) or "none"
    lines += ["", f"Waiting for runs: {waiting}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=str(REPO / "results/training_h100/study"))
    parser.add_argument(
        "--margins", default=str(REPO / "results/training_h100_margins.json")
    )
    parser.add_argument("--out", help="write the table here (default: stdout)")
    args = parser.parse_args(argv)
    text = table(load_runs(args.runs), json.loads(Path(args.margins).read_text()))
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
