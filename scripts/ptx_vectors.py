"""Compile final's, angles' and qk_norm_rope's kernels for the H100 (sm_90) on a machine
with no GPU, and count each variant's global loads and stores by width.

The interpreter runs code the compiler rejects, so this is also the CPU's check that
every kernel compiles (``tests/test_compile_sm90.py`` runs it with ``--quick``).

Triton compiles to PTX (and ptxas to a cubin) without a driver when it is given the
target; only the launch needs a GPU. ropetut's package would switch Triton to its
interpreter on a CPU machine, so this script loads ``ropetut.kernels`` modules without
running the package's ``__init__``. The kernels are compiled with the arguments their
own launchers build (``Compile`` stands in for ``kernel[grid]``), for
4 x 2048 x 8 x 64 q and k by default, the shape of the H100 timings.

    python scripts/ptx_vectors.py [--dump DIR] [--quick]
"""

import argparse
import importlib
import os
import re
import sys
import types
from collections import Counter
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
ROOT = Path(__file__).resolve().parent.parent
for name, folder in (
    ("ropetut", ROOT / "ropetut"),
    ("ropetut.kernels", ROOT / "ropetut" / "kernels"),
):
    package = types.ModuleType(name)
    package.__path__ = [str(folder)]
    sys.modules[name] = package

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

final = importlib.import_module("ropetut.kernels.final")
angles = importlib.import_module("ropetut.kernels.angles")
qk_norm = importlib.import_module("ropetut.kernels.qk_norm_rope")
H100 = GPUTarget("cuda", 90, 32)


class Compile:
    """``kernel[grid](*args, **kwargs)`` that compiles for H100 and keeps the compiled
    kernel in ``Compile.last``, with the specialization (divisibility, strides of 1)
    Triton's JIT derives from the same arguments."""

    last = None

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def compile_for_h100(*args, **kwargs):
            kernel, backend = self.kernel, make_backend(H100)
            binder = create_function_from_signature(
                kernel.signature, kernel.params, backend
            )
            bound, specialization, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = kernel._pack_args(
                backend, kwargs, bound, specialization, options
            )
            source = ASTSource(kernel, signature, constexprs, attrs)
            Compile.last = triton.compile(source, target=H100, options=options.__dict__)
            return Compile.last

        return compile_for_h100


final.rope_final_kernel = Compile(final.rope_final_kernel)
angles.rope_angles_kernel = Compile(angles.rope_angles_kernel)
qk_norm.qk_norm_rope_fwd_kernel = Compile(qk_norm.qk_norm_rope_fwd_kernel)
qk_norm.qk_norm_rope_bwd_kernel = Compile(qk_norm.qk_norm_rope_bwd_kernel)


def compile_final(q, k, qo, ko, R, interleaved, positions):
    cos = torch.empty(q.shape[1], R // 2)
    pos = torch.zeros(q.shape[0], q.shape[1], dtype=torch.int64) if positions else q
    final._first_launch(
        q, k, qo, ko, cos, cos, pos, True, positions, R, interleaved, False
    )


def compile_angles(q, k, qo, ko, R, interleaved, positions):
    words = angles.turn_words(torch.rand(R // 2), q.dtype)
    pos = torch.zeros(q.shape[0], q.shape[1], dtype=torch.int64) if positions else None
    angles.rope_angles(
        q, k, words, qo, ko, positions=pos, interleaved=interleaved, rotary_dim=R
    )


def compile_qk_norm(q, k, qo, ko, R, interleaved, positions, backward=False):
    w = torch.empty(q.shape[-1], dtype=q.dtype)
    cos = torch.empty(q.shape[1], R // 2)
    pos = torch.zeros(q.shape[0], q.shape[1], dtype=torch.int64) if positions else None
    options = dict(
        positions=pos,
        eps=1e-6,
        interleaved=interleaved,
        rotary_dim=R,
        weight_offset=0.0,
    )
    if backward:
        qk_norm.qk_norm_rope_backward(q, k, w, w, cos, cos, qo, ko, **options)
    else:
        qk_norm.qk_norm_rope_forward(q, k, w, w, cos, cos, qo, ko, **options)


def compile_qk_norm_backward(*args):
    compile_qk_norm(*args, backward=True)


def memory_ops(ptx: str) -> Counter:
    """Global loads and stores by width, e.g. ld.global.v4.b32: 8."""
    return Counter(
        re.findall(r"^\s*(?:@!?%p\d+\s+)?((?:ld|st)\.global[\w.]*)", ptx, re.M)
    )


def instructions(ptx: str) -> int:
    return len(re.findall(r"^\s*(?:@!?%p\d+\s+)?[a-z][\w.]*\s", ptx, re.M))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", type=Path, help="write each variant's PTX here")
    parser.add_argument(
        "--quick", action="store_true", help="fewer variants: does each kernel compile?"
    )
    args = parser.parse_args()
    B, T, H, D = 4, 2048, 8, 64
    kernels = (
        ("final", compile_final),
        ("angles", compile_angles),
        ("qk_norm fwd", compile_qk_norm),
        ("qk_norm bwd", compile_qk_norm_backward),
    )
    cases = [
        (name, launch, dtype, d, R, interleaved, positions)
        for name, launch in kernels
        for dtype in (torch.float32, torch.bfloat16)
        for d, R in ((D, D), (2 * D, D))
        for interleaved in (False, True)
        for positions in (False, True)
        if not args.quick or (d == D and positions == interleaved)
    ]
    for name, launch, dtype, d, R, interleaved, positions in cases:
        q, k = (
            torch.empty(B, T, H, d, dtype=dtype),
            torch.empty(B, T, H, d, dtype=dtype),
        )
        launch(
            q, k, torch.empty_like(q), torch.empty_like(k), R, interleaved, positions
        )
        ptx = Compile.last.asm["ptx"]
        pairs = "interleaved" if interleaved else "half-split"
        label = f"{name} {str(dtype)[6:]} D={d} R={R} {pairs}"
        label += " positions" if positions else ""
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(memory_ops(ptx).items()))
        print(f"{label:52s} {instructions(ptx):4d} instructions; {ops}")
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / (label.replace(" ", "_") + ".ptx")).write_text(ptx)


if __name__ == "__main__":
    main()
