"""Every production kernel compiles for the H100 (sm_90), on a machine with no GPU.

Triton's interpreter runs code its compiler rejects (a tuple of dtypes assigned in a
loop did, in ``kernels/angles.py``), so the CPU tests alone can't say a kernel will
build on a GPU. Triton compiles to PTX and a cubin given only the target;
scripts/ptx_vectors.py does, for final, angles and qk_norm_rope (forward and backward),
outside this process: its modules load without ropetut's package, which would switch
Triton to the interpreter.
"""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ptx_vectors.py"


def test_kernels_compile_for_sm90_and_half_split_loads_are_vectorised():
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
    for kernel in ("final", "angles", "qk_norm fwd", "qk_norm bwd"):
        mine = [line for line in lines if line.startswith(kernel + " ")]
        assert len(mine) == 4, (kernel, done.stdout)
    # half-split rows move 16 bytes per load and store, as a copy does
    for line in lines:
        if "half-split" in line:
            assert "ld.global.v4" in line and "st.global.v4" in line, line
