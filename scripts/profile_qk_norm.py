"""One forward and one backward of the fused QK-RMSNorm + RoPE, and a copy of the same
bytes, for a profiler (GPU): issue 25's forward, 88-90 % of the copy floor.

    ncu --clock-control none --kernel-name regex:'qk_norm_rope_(fwd|bwd)_kernel' \\
        --launch-skip 6 --launch-count 2 --set full --import-source yes -o qk_norm \\
        python3 scripts/profile_qk_norm.py
    ncu -i qk_norm.ncu-rep --page details > details.txt
    ncu -i qk_norm.ncu-rep --page source --csv --print-source sass > source.csv
    python3 scripts/ncu_memory_order.py source.csv

The first shape of ``python -m ropetut bench-qk-norm`` (4 x 4096 tokens, 32/8 heads of
128, bf16), called as the bench's fused provider calls it (``apply_qk_norm_rope``, then
the gradients of q, k and the weights): three steps to compile and warm up, then one
(six launches of the two kernels skipped, two profiled). With the flags above, ncu
profiles that last step's forward and backward. The floor's copy (``bench.copy``, one
launch of ``copy_kernel`` a tensor) runs once before and once after, for a kernel at
the floor to set beside them (``--kernel-name copy_kernel``). Prints nothing of its
own.
"""

# ruff: noqa: I001
# ropetut first: on a machine without a GPU it switches Triton to its interpreter
import ropetut
import torch
from ropetut import bench
from ropetut.bench import qk_norm as bench_qk_norm

WARM_UP = 3
SHAPE = bench_qk_norm.SHAPES[0]


def main() -> None:
    if not ropetut.on_gpu():
        raise SystemExit("profile_qk_norm.py needs a GPU: it is for ncu")
    fn, weights = bench_qk_norm.make_provider(bench_qk_norm.FUSED, SHAPE)
    step = bench_qk_norm.training_step(fn, weights)
    q, k, gq, gk = bench.make_inputs(SHAPE, "fwd+bwd")
    bench.copy(q, k)
    for _ in range(WARM_UP + 1):
        step(q, k, gq, gk)
    bench.copy(q, k)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
