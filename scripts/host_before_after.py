"""Host time per call before and after a change, in one session on one GPU (noisy hosts drift).

    python scripts/host_before_after.py BASELINE_DIR [--runs 3] [--qk-norm]

BASELINE_DIR holds an older ``ropetut/`` package (e.g. ``git archive <ref> ropetut | tar -x -C
DIR``). Each run is a fresh process running ``bench.host_rows`` (the host rows of
``python -m ropetut bench``), baseline and current taking turns; each figure is the median over
runs of the per-run medians. Prints one table: provider, mode, before, after, and each one's
ratio to Liger's from the same run. With ``--qk-norm``: the host rows of ``python -m ropetut
bench-qk-norm`` (``bench.qk_norm.host_rows``) instead, and one row more, the fused step's
eager fwd+bwd on bench-qk-norm's first shape (µs a step, GPU and host together: issue 25's
eager target), whose ratio column is left empty.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROWS = "import json; from ropetut import bench; print(json.dumps(bench.host_rows()))"
QK_NORM_ROWS = """import json
from functools import partial
from ropetut import bench
from ropetut.bench import qk_norm as q
rows, shape = q.host_rows(), q.SHAPES[0]
step = q.training_step(*q.make_provider(q.FUSED, shape))
ms, = bench.interleaved_ms([step], make_inputs=partial(bench.make_inputs, shape, "fwd+bwd"))
rows.append(dict(provider=q.FUSED, mode="eager " + shape.label, host_us=1e3 * ms,
                 vs_liger=None))
print(json.dumps(rows))"""


def host_rows(package_dir: Path, rows=ROWS) -> list:
    out = subprocess.run([sys.executable, "-c", rows], cwd=package_dir, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("baseline", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--qk-norm", action="store_true")
    args = parser.parse_args()
    rows = QK_NORM_ROWS if args.qk_norm else ROWS
    runs = {"before": [], "after": []}
    for _ in range(args.runs):
        runs["before"].append(host_rows(args.baseline.resolve(), rows))
        runs["after"].append(host_rows(REPO, rows))

    def median(which, provider, mode, key):
        values = sorted(r[key] for rows in runs[which] for r in rows
                        if r["provider"] == provider and r["mode"] == mode)
        return values[len(values) // 2]

    print(f"{'provider':24} {'mode':7} {'before us':>9} {'after us':>9} "
          f"{'before/liger':>12} {'after/liger':>11}")
    for r in runs["after"][0]:
        p, m = r["provider"], r["mode"]
        ratios = [median(w, p, m, "vs_liger") if r["vs_liger"] is not None else float("nan")
                  for w in ("before", "after")]
        print(f"{p:24} {m:7} {median('before', p, m, 'host_us'):9.1f} "
              f"{median('after', p, m, 'host_us'):9.1f} {ratios[0]:12.2f} {ratios[1]:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
