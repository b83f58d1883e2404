"""The kernel registry: every RoPE kernel ropetut runs, what each supports, and how to
launch it.

Kernels, one version per file: v1 -> v4 retell the seed's journey, ``final`` is what
users call, ``cute`` is the appendix's CuTeDSL kernel (optional). Each has one entry in
``KERNELS``: a ``Supports`` record and a launcher with one signature. ``apply_rope``'s
checks, the registered operators, the benchmark, the model and the tests read what
a kernel can do here, nowhere else; a new kernel is one file in this folder and
one entry below.

Every launcher is called on validated (B, T, H, D) views, and writes q_out and k_out:

    launch(q, k, cos, sin, q_out, k_out, *,
           positions, interleaved, rotary_dim, backward, prepared)

    q, q_out: (B, T, Hq, D); k, k_out: (B, T, Hkv, D) or None; any strides;
        q_out is q in place.
    cos, sin: (n_positions, rotary_dim/2), contiguous.
    positions: None or (B, T) integers.
    backward: turn by -theta.
    prepared: what ``prepare_backward`` returned in the forward, or None.

This file imports without CuTeDSL: the ``cute`` launcher imports its module when
first called. It sits below ``ropetut.validate``, which reads the ``Supports`` records
to check arguments.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import torch

from ..runtime import on_gpu
from .final import prepare_backward as _final_prepare_backward
from .final import rope_final
from .qk_norm_rope import qk_norm_rope_forward
from .v1 import rope_v1
from .v2 import rope_v2
from .v3 import rope_v3
from .v4 import rope_v4

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class RopeOptions(NamedTuple):
    """How to turn q and k: everything a launch needs but the tensors themselves."""

    cos: torch.Tensor  # (n_positions, rotary_dim/2), contiguous
    sin: torch.Tensor
    positions: torch.Tensor | None  # (B, T) view (stride 0 over B when given as (T,))
    interleaved: bool
    rotary_dim: int
    inplace: bool
    kernel: "Kernel"  # the registry entry that runs it
    # (checked by ``validate.check_rope_args``, which reads values)
    check_positions: bool = False
    backward: bool = False  # turn by -theta (the gradient of a turn by theta)


def rows_fit_vectors(
    t: torch.Tensor, vector_bytes: int, *, check_pointer: bool = True
) -> bool:
    """Can a kernel read t's rows ``vector_bytes`` at a time? Unit stride in D,
    every other stride a whole number of vectors, and (unless check_pointer=False:
    torch.compile's fake tensors have no address) a start aligned to the vector."""
    vec = vector_bytes // t.element_size()
    return (
        t.stride(-1) == 1
        and all(s % vec == 0 for s in t.stride()[:-1])
        and (not check_pointer or t.data_ptr() % vector_bytes == 0)
    )


@dataclass(frozen=True)
class Supports:
    """What a kernel can do. ``validate.check_supports`` refuses the rest, naming
    the argument."""

    # "half": (x[i], x[i+R/2]); "interleaved": (x[2i], x[2i+1])
    pairs: tuple[str, ...] = ("half",)
    positions: bool = False  # a (B, T) table row per token
    partial: bool = False  # rotary_dim < D: the other dims pass through
    inplace: bool = False
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES  # of q and k, and of the tables
    # > 0: rows read this many bytes at a time (unit stride in D, other strides whole
    # vectors, aligned starts)
    vector_bytes: int = 0
    max_elements: int | None = None  # 32-bit offsets: q and k below this many elements


# one record per kernel: compared (and hashed) by identity
@dataclass(frozen=True, eq=False)
class Kernel:
    name: str
    launch: Callable
    supports: Supports
    # (q_out, k_out, cos, sin, positions, *, interleaved, rotary_dim) -> ``prepared``
    prepare_backward: Callable | None = None
    # () -> why it can't run here, or None: an optional kernel (needs what ropetut
    # doesn't install)
    why_unavailable: Callable | None = None

    @property
    def half_split(self) -> bool:
        """The pairing to use where either will do (a model, a benchmark): half-split if
        it has it."""
        return "half" in self.supports.pairs


def _one_tensor_at_a_time(launch_one):
    """V1-V3 rotate one tensor per launch, forward only: their backward is the forward
    with sin negated, and k is a second launch."""

    def launch(
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        *,
        positions,
        interleaved,
        rotary_dim,
        backward,
        prepared=None,
    ):
        sin = -sin if backward else sin
        launch_one(q, cos, sin, q_out)
        if k is not None:
            launch_one(k, cos, sin, k_out)
        return q_out, k_out

    return launch


def _launch_v4(
    q,
    k,
    cos,
    sin,
    q_out,
    k_out,
    *,
    positions,
    interleaved,
    rotary_dim,
    backward,
    prepared=None,
):
    return rope_v4(q, k, cos, sin, q_out, k_out, backward=backward)


def _launch_final(
    q,
    k,
    cos,
    sin,
    q_out,
    k_out,
    *,
    positions,
    interleaved,
    rotary_dim,
    backward,
    prepared=None,
):
    return rope_final(
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        positions=positions,
        interleaved=interleaved,
        rotary_dim=rotary_dim,
        backward=backward,
        key=prepared,
    )


# kernels that compute in fp32
FLOAT32_MATH = (torch.float32, torch.float16, torch.bfloat16)


def _cute_unavailable():
    if not on_gpu():
        return (
            "impl='cute' needs a CUDA GPU: CuTeDSL compiles for NVIDIA GPUs only, "
            "and this machine runs ropetut's kernels through Triton's interpreter"
        )
    try:
        from . import cute  # noqa: F401
    except ImportError as e:
        return (
            f"impl='cute' needs NVIDIA's CuTeDSL, which does not import ({e}): "
            f"{CUTE_INSTALL}"
        )
    return None


CUTE_INSTALL = (
    "pip install 'nvidia-cutlass-dsl[cu13]' apache-tvm-ffi for a CUDA 13 driver, "
    "pip install nvidia-cutlass-dsl apache-tvm-ffi for CUDA 12"
)
CUTE_VECTOR_BYTES = 16


def _launch_cute(
    q,
    k,
    cos,
    sin,
    q_out,
    k_out,
    *,
    positions,
    interleaved,
    rotary_dim,
    backward,
    prepared=None,
):
    """The CuTeDSL kernel reads rows 16 bytes at a time. Inputs that ``apply_rope`` let
    through fit; gradients come in whatever strides autograd chose, so a backward copies
    the ones that don't, and writes through a contiguous buffer if it must."""
    from .cute import rope_cute

    def fits(t):
        return t is None or rows_fit_vectors(t, CUTE_VECTOR_BYTES)

    q, k = (t if fits(t) else t.contiguous() for t in (q, k))
    cos, sin = (
        t if t.data_ptr() % CUTE_VECTOR_BYTES == 0 else t.clone() for t in (cos, sin)
    )
    outs = [
        t if fits(t) else torch.empty_like(t, memory_format=torch.contiguous_format)
        for t in (q_out, k_out)
    ]
    rope_cute(q, k, cos, sin, *outs, positions=positions, backward=backward)
    for given, used in zip((q_out, k_out), outs):
        if used is not given:
            given.copy_(used)
    return q_out, k_out


KERNELS = {
    "v1": Kernel(
        "v1", _one_tensor_at_a_time(rope_v1), Supports(pairs=("interleaved",))
    ),
    "v2": Kernel("v2", _one_tensor_at_a_time(rope_v2), Supports()),
    "v3": Kernel("v3", _one_tensor_at_a_time(rope_v3), Supports()),
    # widens to fp32, always
    "v4": Kernel("v4", _launch_v4, Supports(dtypes=FLOAT32_MATH)),
    "final": Kernel(
        "final",
        _launch_final,
        Supports(
            pairs=("half", "interleaved"), positions=True, partial=True, inplace=True
        ),
        prepare_backward=_final_prepare_backward,
    ),
    "cute": Kernel(
        "cute",
        _launch_cute,
        Supports(
            positions=True,
            inplace=True,
            dtypes=FLOAT32_MATH,
            vector_bytes=CUTE_VECTOR_BYTES,
            max_elements=2**31,
        ),
        why_unavailable=_cute_unavailable,
    ),
}
IMPLS = tuple(
    name for name, kernel in KERNELS.items() if kernel.why_unavailable is None
)
OPTIONAL_IMPLS = tuple(
    name for name, kernel in KERNELS.items() if kernel.why_unavailable
)


def get_kernel(impl) -> Kernel:
    """The registry's entry for ``impl``; ValueError naming the argument if
    there is none."""
    kernel = KERNELS.get(impl) if isinstance(impl, str) else None
    if kernel is None:
        raise ValueError(f"impl: must be one of {tuple(KERNELS)}, got {impl!r}")
    return kernel


@cache
def unavailable(impl: str) -> str | None:
    """Why ``impl`` can't run here, or None when it can (asked once: it may
    import a package)."""
    kernel = get_kernel(impl)
    return None if kernel.why_unavailable is None else kernel.why_unavailable()


def rotate(q, k, options: RopeOptions):
    """Allocate the outputs (none in place), launch ``options.kernel``, return
    (q_out, k_out). q, k and options come from ``validate.check_rope_args``.

    An empty q or k (no tokens, no heads, no batch) launches nothing for it. In place,
    q's and k's version counters are bumped as torch's own in-place ops bump them,
    so a graph that saved them before the write raises instead of computing with
    the new values."""
    inplace = options.inplace
    q_out = q if inplace else torch.empty_like(q)
    k_out = None if k is None else (k if inplace else torch.empty_like(k))
    if q.numel() and (k is None or k.numel()):
        _launch(q, k, q_out, k_out, options)
    elif q.numel() or (k is not None and k.numel()):
        # one of them is empty: the other alone
        x, x_out = (q, q_out) if q.numel() else (k, k_out)
        _launch(x, None, x_out, None, options)
    if inplace:
        torch.autograd.graph.increment_version(q if k is None else (q, k))
    return q_out, k_out


def _launch(q, k, q_out, k_out, options):
    options.kernel.launch(
        q,
        k,
        options.cos,
        options.sin,
        q_out,
        k_out,
        positions=options.positions,
        interleaved=options.interleaved,
        rotary_dim=options.rotary_dim,
        backward=options.backward,
    )


# Not one of ``KERNELS`` (its launchers take weights and eps; it has its own backward):
# ``ropetut.qk_norm_op`` passes this record to ``validate.check_rope_args``, which
# refuses what it can't do by the same rules.
QK_NORM_ROPE = Kernel(
    "qk_norm_rope",
    qk_norm_rope_forward,
    Supports(pairs=("half", "interleaved"), positions=True, partial=True, inplace=True),
)
