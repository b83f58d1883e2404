"""Compile every production Triton kernel in ropetut/kernels/ for the H100 (sm_90) on a
machine with no GPU, and count each variant's global loads and stores by width.

The interpreter runs code the compiler rejects (a tuple of dtypes assigned in a loop;
two returns of different dtypes behind a constexpr ``if``), so this is also the CPU's
check that every kernel compiles: ``tests/test_compile_sm90.py`` runs it with --quick.

Covered: v1, v2, v3, v4, final, angles and qk_norm_rope's forward and backward kernels
(not cute.py: CuTeDSL), each in fp32, fp16, bf16 and fp64 (v4 takes no fp64), forward
(fwd) and backward (bwd), as their launchers build the arguments:

- the backward of v4, final and angles is the same kernel with BACKWARD=True, out of
  place, as autograd launches it; v1-v3's is the same launch with sin negated on the
  host (the same compile, listed twice); qk_norm's is its backward kernel;
- --quick (CI; 78 variants, under a minute): final, angles and qk_norm in two variants
  that between them flip every option: half-split with D = R = 64, and interleaved
  with positions and partial rotary (D = 128, R = 64: the other dims are copied);
  cos and sin in fp32;
- the full run (484 variants, minutes): every combination of pairs, positions and
  partial rotary; cos and sin in fp32 and in q's dtype; and int64 offsets (``wide``:
  q of 2**32 elements on the meta device, so nothing is allocated; full rotary only,
  since meta tensors share one address, which a launcher would read as in place).

Triton compiles to PTX (and ptxas to a cubin) without a driver when it is given the
target; only the launch needs a GPU. ropetut's package would switch Triton to its
interpreter on a CPU machine, so this script loads ``ropetut.kernels`` modules without
running the package's ``__init__``. ``Compile`` stands in for ``kernel[grid]``; q and k
are 4 x 2048 x 8 x D, the shape of the H100 timings. One line per variant:

    kernel fwd|bwd dtype D=.. R=.. pairs [positions] [tables=dtype] [wide]  counts

    python scripts/ptx_vectors.py [--dump DIR] [--quick]
"""

import argparse
import importlib
import os
import re
import sys
import types
from collections import Counter
from collections.abc import Callable
from itertools import product
from pathlib import Path
from typing import NamedTuple

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
from triton.compiler.errors import CompilationError  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

v1, v2, v3, v4, final, angles, qk_norm, launch_cache = (
    importlib.import_module(f"ropetut.kernels.{name}")
    for name in ("v1", "v2", "v3", "v4", "final", "angles", "qk_norm_rope", "launch")
)
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


for module, kernel_name in (
    (v1, "rope_v1_kernel"),
    (v2, "rope_v2_kernel"),
    (v3, "rope_v3_kernel"),
    (v4, "rope_v4_kernel"),
    (final, "rope_final_kernel"),
    (angles, "rope_angles_kernel"),
    (qk_norm, "qk_norm_rope_fwd_kernel"),
    (qk_norm, "qk_norm_rope_bwd_kernel"),
):
    setattr(module, kernel_name, Compile(getattr(module, kernel_name)))

# Every launcher: (q, k, q_out, k_out, cos, sin, positions, R, interleaved, backward).
# q_out and k_out are the output gradients for qk_norm's backward.


def one_at_a_time(launch_one):
    """v1-v3 as the registry launches them: one tensor per launch, backward = sin
    negated (kernels/__init__.py's ``_one_tensor_at_a_time``)."""

    def launch(q, k, qo, ko, cos, sin, pos, R, interleaved, backward):
        sin = -sin if backward else sin
        launch_one(q, cos, sin, qo)
        launch_one(k, cos, sin, ko)

    return launch


def launch_v4(q, k, qo, ko, cos, sin, pos, R, interleaved, backward):
    v4.rope_v4(q, k, cos, sin, qo, ko, backward=backward)


def launch_final(q, k, qo, ko, cos, sin, pos, R, interleaved, backward):
    final._LAUNCHES.clear()  # no cached launch: each variant goes through the JIT
    final.rope_final(
        q, k, cos, sin, qo, ko, positions=pos, interleaved=interleaved,
        rotary_dim=R, backward=backward,
    )  # fmt: skip


def launch_angles(q, k, qo, ko, cos, sin, pos, R, interleaved, backward):
    launch_cache._KEPT.clear()  # as for final: each variant goes through the JIT
    # inv_freq in fp64 for fp64 inputs (as gradcheck's), in fp32 otherwise
    inv_freq = torch.rand(R // 2, dtype=torch.promote_types(q.dtype, torch.float32))
    angles.rope_angles(
        q, k, inv_freq, qo, ko, positions=pos, interleaved=interleaved, rotary_dim=R,
        backward=backward,
    )  # fmt: skip


def launch_qk_norm(q, k, qo, ko, cos, sin, pos, R, interleaved, backward):
    launch_cache._KEPT.clear()
    w = torch.empty(q.shape[-1], dtype=q.dtype)  # in q's dtype, the tests' default
    launch = qk_norm.qk_norm_rope_backward if backward else qk_norm.qk_norm_rope_forward
    launch(
        q, k, w, w, cos, sin, qo, ko, positions=pos, eps=1e-6, interleaved=interleaved,
        rotary_dim=R, weight_offset=0.0,
    )  # fmt: skip


FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class Kernel(NamedTuple):
    launch: Callable
    dtypes: tuple = FLOATS
    pairs: tuple = (False, True)  # interleaved?
    options: bool = True  # positions, partial rotary, int64 offsets
    tables: bool = True  # reads cos and sin


KERNELS = {
    "v1": Kernel(one_at_a_time(v1.rope_v1), pairs=(True,), options=False),
    "v2": Kernel(one_at_a_time(v2.rope_v2), pairs=(False,), options=False),
    "v3": Kernel(one_at_a_time(v3.rope_v3), pairs=(False,), options=False),
    "v4": Kernel(launch_v4, FLOATS[:3], pairs=(False,), options=False),
    "final": Kernel(launch_final),
    "angles": Kernel(launch_angles, tables=False),
    "qk_norm": Kernel(launch_qk_norm),
}


class Variant(NamedTuple):
    kernel: str
    dtype: torch.dtype
    backward: bool
    tables: torch.dtype  # of cos and sin
    interleaved: bool
    positions: bool = False
    partial: bool = False
    wide: bool = False  # q of 2**32 elements, on the meta device

    @property
    def D_R(self):
        return (128, 64) if self.partial else (64, 64)

    def __str__(self):
        D, R = self.D_R
        words = [self.kernel, "bwd" if self.backward else "fwd", _name(self.dtype)]
        pairs = "interleaved" if self.interleaved else "half-split"
        words += [f"D={D}", f"R={R}", pairs]
        if self.positions:
            words.append("positions")
        if self.tables != torch.float32:
            words.append(f"tables={_name(self.tables)}")
        if self.wide:
            words.append("wide")
        return " ".join(words)


def _name(dtype):
    return str(dtype).removeprefix("torch.")


def variants(quick):
    """Every kernel x dtype x direction, in the options the docstring lists."""
    for name, kernel in KERNELS.items():
        if not kernel.options:
            options = [(interleaved,) for interleaved in kernel.pairs]
        elif quick:  # two that flip every option
            options = [(False,), (True, True, True)]
        else:  # (interleaved, positions, partial, wide); wide with full rotary
            options = product((False, True), repeat=4)
            options = [o for o in options if not (o[2] and o[3])]
        for dtype, backward in product(kernel.dtypes, (False, True)):
            own = kernel.tables and not quick and dtype != torch.float32
            for tables in (torch.float32, dtype) if own else (torch.float32,):
                for option in options:
                    yield Variant(name, dtype, backward, tables, *option)


def compile_variant(v: Variant):
    """The compiled kernel the variant's launcher builds, for (B, T, H, D) q and k of
    4 x 2048 x 8 x D (8 x 2**20 x 8 x D wide)."""
    B, T, H = (8, 2**20, 8) if v.wide else (4, 2048, 8)
    (D, R), device = v.D_R, "meta" if v.wide else "cpu"
    q, k, qo, ko = (  # four tensors: not in place
        torch.empty(B, T, H, D, dtype=v.dtype, device=device) for _ in range(4)
    )
    cos, sin = torch.empty(2, T, R // 2, dtype=v.tables, device=device)
    pos = torch.empty(B, T, dtype=torch.int64, device=device) if v.positions else None
    KERNELS[v.kernel].launch(q, k, qo, ko, cos, sin, pos, R, v.interleaved, v.backward)
    return Compile.last


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
    rejected = []
    for variant in variants(args.quick):
        try:
            ptx = compile_variant(variant).asm["ptx"]
        except CompilationError as error:  # say which and why, then go on
            while isinstance(error.__cause__, CompilationError):
                error = error.__cause__  # the innermost: the line, and the reason
            print(f"{variant}: does not compile: {error}", file=sys.stderr)
            rejected.append(str(variant))
            continue
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(memory_ops(ptx).items()))
        print(f"{variant!s:60s} {instructions(ptx):5d} instructions; {ops}", flush=True)
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / (str(variant).replace(" ", "_") + ".ptx")).write_text(ptx)
    if rejected:
        sys.exit(f"{len(rejected)} variants do not compile: " + "; ".join(rejected))


if __name__ == "__main__":
    main()
