"""Every production kernel compiles for the H100 (sm_90), on a machine with no GPU.

Triton's interpreter runs code its compiler rejects (a tuple of dtypes assigned in a
loop did, in ``kernels/angles.py``; two returns of different dtypes behind a constexpr
``if`` did, in ``kernels/qk_norm_rope.py``, failing every fp64 QK-norm test on the
GPU), so the CPU tests alone can't say a kernel will build on a GPU. Triton compiles to
PTX and a cubin given only the target; scripts/ptx_vectors.py does, for v1-v4, final,
angles and qk_norm_rope, forward and backward, in every dtype their tests use, outside
this process: its modules load without ropetut's package, which would switch Triton to
the interpreter.
"""

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ptx_vectors.py"
ALL = ("float32", "float16", "bfloat16", "float64")
# kernel: (dtypes, variants per dtype and direction in --quick)
COVERED = {
    "v1": (ALL, 1),
    "v2": (ALL, 1),
    "v3": (ALL, 1),
    "v4": (ALL[:3], 1),  # v4 computes in fp32: no fp64
    "final": (ALL, 2),  # half-split; interleaved with positions and partial rotary
    "angles": (ALL, 2),
    "qk_norm": (ALL, 2),
}


def widths(line: str, op: str) -> set[int]:
    """The byte widths of a line's global loads (op "ld") or stores ("st"):
    ld.global.v4.b32 and ld.global.v2.b64 are 16."""
    found = re.findall(rf"\b{op}\.global(?:\.nc)?(?:\.v(\d))?\.[bfsu](\d+)", line)
    return {int(n or 1) * int(bits) // 8 for n, bits in found}


def narrow_stores(line: str) -> int:
    """How many of a line's global stores move less than 16 bytes."""
    stores = re.findall(r"(st\.global[\w.]*) x(\d+)", line)
    return sum(int(n) for op, n in stores if max(widths(op, "st")) < 16)


def test_widths_reads_ptx_names():
    line = "ld.global.b32 x2, ld.global.nc.v2.b64 x4, st.global.v4.b32 x8"
    line += ", st.global.b16 x2"
    assert widths(line, "ld") == {4, 16} and widths(line, "st") == {16, 2}
    assert narrow_stores(line) == 2


def test_kernels_compile_for_sm90_and_rows_are_vectorised():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # one line per variant: "kernel fwd|bwd dtype D=.. R=.. pairs ...  counts"
    got = Counter(tuple(line.split()[:3]) for line in lines)
    expected = {
        (kernel, direction, dtype): n
        for kernel, (dtypes, n) in COVERED.items()
        for direction in ("fwd", "bwd")
        for dtype in dtypes
    }
    assert got == expected, done.stdout
    assert len(lines) == sum(expected.values()) == 78
    # Rows move 16 bytes per load and store, as a copy does (v2.b64 in fp64), but in
    # v1 (a row a program, its pairs in two loads of stride 2) and v3 (programs of 32
    # pairs give each thread one pair). Interleaved rows too: loaded whole and split in
    # registers, they store nothing element-wise but qk_norm backward's few dw sums.
    for line in lines:
        if not line.startswith(("v1 ", "v3 ")):
            assert 16 in widths(line, "ld") and 16 in widths(line, "st"), line
            assert narrow_stores(line) <= 6, line
