"""Where each kernel's memory traffic and barriers fall in the instructions it executes.

    ncu -i REPORT --page source --csv --print-source sass > source.csv
    python scripts/ncu_memory_order.py source.csv

For each kernel in an Nsight Compute source page (SASS, with its per-instruction
counters), the instructions it executed, in address order, and among them every global
load and store, shared-memory access and barrier: its place in that order, its
executions and its text. One decode step is straight-line code but for its loop over
heads, so address order is the order a warp issues them in
(``scripts/profile_decode_angles.py`` makes such a report).
"""

import csv
import re
import sys

MEMORY = re.compile(r"\b(LDG|STG|LDS|STS|STSM|BAR)\b")


def kernels(rows):
    """{kernel name: [row dict, ...]} from the page's CSV rows."""
    found, name, header = {}, None, None
    for row in rows:
        if row and row[0] == "Kernel Name":
            name = row[1]
            found[name] = []
        elif row and row[0] == "Address":
            header = row
        elif name and header and len(row) == len(header):
            found[name].append(dict(zip(header, row, strict=True)))
    return found


def main(path):
    with open(path, newline="") as f:
        found = kernels(csv.reader(f))
    for name, rows in found.items():
        run = [r for r in rows if int(r["Instructions Executed"] or 0) > 0]
        total = sum(int(r["Instructions Executed"]) for r in run)
        print(f"== {name}: {len(run)} instructions executed, {total} executions")
        for place, r in enumerate(run, start=1):
            text = r["Source"].strip()
            if MEMORY.search(text):
                print(f"  {place:5d}  x{int(r['Instructions Executed']):<5d} {text}")


if __name__ == "__main__":
    main(sys.argv[1])
