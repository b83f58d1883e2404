"""RoPE as PyTorch operators: what ``torch.compile``, ``torch.export`` and CUDA-graph trees see.

- ``torch.ops.ropetut.rope``: out of place, returns (q_out, k_out), differentiable;
- ``torch.ops.ropetut.rope_``: in place, declares that it writes q and k (``mutates_args``).

Each is registered with ``torch.library.custom_op`` and has a *fake* implementation: the shapes,
strides and dtypes of its outputs, computed without running anything, which is all a compiler
needs to trace around it. To ``torch.compile`` each is one opaque node: no graph break, and
with ``mode="reduce-overhead"`` it is captured into the CUDA graph like any other kernel.
``rope``'s backward is ``rope`` turning by -theta. Autograd cannot go through an operator that
mutates its inputs, so ``rope_`` is for calls with no gradient to track.

``apply_rope`` calls these operators when it is being traced. Eagerly it calls ``rotate`` and
``run_kernel`` below directly: the dispatcher would add host time to every call and nothing else.
"""
from functools import cache
from typing import Optional

import torch
from torch import Tensor

from .kernels.final import rope_final
from .kernels.v1 import rope_v1
from .kernels.v2 import rope_v2
from .kernels.v3 import rope_v3
from .kernels.v4 import rope_v4
from .launch import check_positions_in_range
from .runtime import on_gpu

_SINGLE_TENSOR = {"v1": rope_v1, "v2": rope_v2, "v3": rope_v3}


CUTE_INSTALL = ("pip install 'nvidia-cutlass-dsl[cu13]' apache-tvm-ffi for a CUDA 13 driver, "
                "pip install nvidia-cutlass-dsl apache-tvm-ffi for CUDA 12")


@cache
def cute_unavailable() -> str | None:
    """Why ``impl="cute"`` cannot run here (no GPU, or no CuTeDSL), or None when it can."""
    if not on_gpu():
        return ("impl='cute' needs a CUDA GPU: CuTeDSL compiles for NVIDIA GPUs only, and this "
                "machine runs ropetut's kernels through Triton's interpreter")
    try:
        from .kernels import cute  # noqa: F401
    except ImportError as e:
        return f"impl='cute' needs NVIDIA's CuTeDSL, which does not import ({e}): {CUTE_INSTALL}"
    return None


def run_kernel(impl, q, k, cos, sin, q_out, k_out, *, positions=None, interleaved=False,
               rotary_dim=None, backward=False):
    """Launch one version's kernel on validated (B, T, H, D) views, writing q_out and k_out."""
    if impl == "cute":
        return _run_cute(q, k, cos, sin, q_out, k_out, positions, backward)
    if impl == "final":
        return rope_final(q, k, cos, sin, q_out, k_out, positions=positions,
                          interleaved=interleaved, rotary_dim=rotary_dim, backward=backward)
    if impl == "v4":
        return rope_v4(q, k, cos, sin, q_out, k_out, backward=backward)
    launch = _SINGLE_TENSOR[impl]           # v1-v3 rotate one tensor per launch, forward only:
    sin = -sin if backward else sin         # their backward is the forward with sin negated
    launch(q, cos, sin, q_out)
    if k is not None:
        launch(k, cos, sin, k_out)
    return q_out, k_out


def _run_cute(q, k, cos, sin, q_out, k_out, positions, backward):
    """The CuTeDSL kernel needs rows it can read 16 bytes at a time (``cute_fits``). Inputs that
    ``apply_rope`` let through fit; gradients come in whatever strides autograd chose, so a
    backward copies the ones that don't, and writes through a contiguous buffer if it must."""
    from .kernels.cute import rope_cute
    q, k = (t if t is None or cute_fits(t) else t.contiguous() for t in (q, k))
    cos, sin = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (cos, sin))
    outs = [t if t is None or cute_fits(t) else torch.empty_like(t, memory_format=torch.contiguous_format)
            for t in (q_out, k_out)]
    rope_cute(q, k, cos, sin, *outs, positions=positions, backward=backward)
    for given, used in zip((q_out, k_out), outs):
        if used is not given:
            given.copy_(used)
    return q_out, k_out


def cute_fits(t: Tensor, *, check_pointer: bool = True) -> bool:
    """Can CuTeDSL's kernel read t's rows 16 bytes at a time? Unit stride in D, every other
    stride a whole number of 16-byte vectors, and (unless check_pointer=False: torch.compile's
    fake tensors have no address) a 16-byte aligned start."""
    vec = 16 // t.element_size()
    return (t.stride(-1) == 1 and all(s % vec == 0 for s in t.stride()[:-1])
            and (not check_pointer or t.data_ptr() % 16 == 0))


def rotate(q, k, cos, sin, positions, interleaved, rotary_dim, inplace, impl,
           check_positions=False, backward=False):
    """Allocate the outputs (none in place), then launch. Returns (q_out, k_out)."""
    if check_positions and positions is not None:
        check_positions_in_range(positions, cos.shape[0])
    q_out = q if inplace else torch.empty_like(q)
    k_out = None if k is None else (k if inplace else torch.empty_like(k))
    return run_kernel(impl, q, k, cos, sin, q_out, k_out, positions=positions,
                      interleaved=interleaved, rotary_dim=rotary_dim, backward=backward)


# The schema is read from the type hints. An operator returns a fixed number of tensors, so
# without k the second output is an empty tensor.
@torch.library.custom_op("ropetut::rope", mutates_args=())
def rope(q: Tensor, k: Optional[Tensor], cos: Tensor, sin: Tensor, positions: Optional[Tensor],
         interleaved: bool, rotary_dim: int, backward: bool, impl: str,
         check_positions: bool) -> tuple[Tensor, Tensor]:
    q_out, k_out = rotate(q, k, cos, sin, positions, interleaved, rotary_dim, False, impl,
                          check_positions, backward)
    return q_out, q.new_empty(0) if k_out is None else k_out


@rope.register_fake
def _(q, k, cos, sin, positions, interleaved, rotary_dim, backward, impl, check_positions):
    return torch.empty_like(q), q.new_empty(0) if k is None else torch.empty_like(k)


def _save_for_backward(ctx, inputs, output):
    _, k, cos, sin, positions, interleaved, rotary_dim, backward, impl, _ = inputs
    ctx.save_for_backward(cos, sin, positions)
    ctx.options = (k is not None, interleaved, rotary_dim, backward, impl)


def _backward(ctx, dq, dk):
    cos, sin, positions = ctx.saved_tensors
    has_k, interleaved, rotary_dim, backward, impl = ctx.options
    dq_in, dk_in = rope(dq, dk if has_k else None, cos, sin, positions, interleaved, rotary_dim,
                        not backward, impl, False)
    return dq_in, dk_in if has_k else None, None, None, None, None, None, None, None, None


rope.register_autograd(_backward, setup_context=_save_for_backward)


@torch.library.custom_op("ropetut::rope_", mutates_args=("q", "k"))
def rope_(q: Tensor, k: Optional[Tensor], cos: Tensor, sin: Tensor, positions: Optional[Tensor],
          interleaved: bool, rotary_dim: int, impl: str, check_positions: bool) -> None:
    rotate(q, k, cos, sin, positions, interleaved, rotary_dim, True, impl, check_positions)


@rope_.register_fake
def _(q, k, cos, sin, positions, interleaved, rotary_dim, impl, check_positions):
    return None


def rope_traced(q, k, cos, sin, positions, interleaved, rotary_dim, inplace, impl,
                check_positions, wants_grad):
    """What ``apply_rope`` calls under ``torch.compile``, on validated (B, T, H, D) views."""
    if inplace and not wants_grad:
        rope_(q, k, cos, sin, positions, interleaved, rotary_dim, impl, check_positions)
        return q, k
    q_out, k_out = rope(q, k, cos, sin, positions, interleaved, rotary_dim, False, impl,
                        check_positions)
    k_out = None if k is None else k_out
    if inplace:   # with a gradient, autograd cannot go through rope_: rotate, then write back
        q.copy_(q_out)
        if k is not None:
            k.copy_(k_out)
        return q, k
    return q_out, k_out
