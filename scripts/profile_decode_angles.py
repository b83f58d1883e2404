"""One decode step of the table-free kernel and of the table kernel, for a profiler (GPU).

    ncu --clock-control none --kernel-name regex:'rope_(final|angles)_kernel' \
        --launch-skip 6 --launch-count 2 --set full --import-source yes -o decode \
        python3 scripts/profile_decode_angles.py
    ncu -i decode.ncu-rep --page details > details.txt
    ncu -i decode.ncu-rep --page source --csv --print-source sass > source.csv
    python3 scripts/ncu_memory_order.py source.csv

(as run for results/profiles/, about a minute on the H200)

Issue 26's decode shape as ``python -m ropetut bench-angles`` builds it (64 sequences
of one token, 32/8 heads of 128, bf16, positions near 2**20): each provider three
times to compile and warm up, in turn, then once each. With the flags above, ncu
profiles those last two launches, the table's first. Prints nothing of its own.
"""

# ruff: noqa: I001
# ropetut first: on a machine without a GPU it switches Triton to its interpreter
import ropetut
import torch
from ropetut import bench
from ropetut.bench import angles as bench_angles

WARM_UP = 3
DECODE = next(s for s in bench_angles.SHAPES if s.positions)


def main() -> None:
    if not ropetut.on_gpu():
        raise SystemExit("profile_decode_angles.py needs a GPU: it is for ncu")
    providers = [bench_angles.make_provider(name, DECODE)
                 for name in (bench_angles.TABLE, bench_angles.TABLE_FREE)]  # fmt: skip
    inputs = bench.make_inputs(DECODE, "fwd")
    for calls in (WARM_UP, 1):
        for provider in providers:
            for _ in range(calls):
                provider(*inputs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
