"""QK-norm + RoPE's checks, and its operators: what ``torch.compile`` sees.

- ``check_qk_norm_args``: ``validate.check_rope_args`` for q, k, the tables and
  positions, then the weights, eps and weight_offset; ``TypeError``/``ValueError``
  naming the argument, before anything is written. It never reads a tensor's values
  (no wait for the GPU). A plain call is checked in full once per key, whose token
  the launches then keep their plans under (host time: issue 25's eager fwd+bwd).
- ``torch.ops.ropetut.qk_norm_rope``: out of place, returns (q_out, k_out),
  differentiable once in q, k, w_q and w_k (its backward is the operator
  ``qk_norm_rope_backward``, itself not differentiable);
- ``torch.ops.ropetut.qk_norm_rope_``: in place, declares that it writes q and k.
  Forward only.

As in ``ropetut.op``: each operator validates its arguments and has a fake
implementation (the outputs' shapes, strides and dtypes), so the compiler traces around
it as one opaque node. q and k are (B, T, H, D) views, any strides;
``apply_qk_norm_rope`` calls the operators only when it is being traced, and the
kernels' launchers directly otherwise.
"""

import itertools
import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from .kernels import FLOAT_DTYPES, QK_NORM_ROPE, RopeOptions
from .kernels import qk_norm_rope as launcher  # FORWARD, BACKWARD: read on every call
from .kernels.qk_norm_rope import (
    backward_key,
    qk_norm_rope_backward,
    qk_norm_rope_forward,
)
from .validate import _as_bthd, check_no_overlap, check_rope_args
from .validate import _plain_key as _plain_rope_key


class QKNormOptions(NamedTuple):
    """Everything a launch needs but q, k and the weights."""

    rope: RopeOptions  # tables, positions, pairs, rotary_dim, inplace
    eps: float
    weight_offset: float  # 1.0: Gemma's (1 + w)
    # a plain call's token, one per ``_plain_key``, which holds all that both launches'
    # plans depend on (outputs and gradients laid out like q and k): they are kept
    # under it (an int hashes faster than the key). None: each launch computes its own
    # ``launch_key``
    token: Optional[int] = None


def check_qk_norm_args(
    q,
    k,
    w_q,
    w_k,
    cos,
    sin,
    positions=None,
    *,
    eps=1e-6,
    interleaved=False,
    rotary_dim=None,
    inplace=False,
    weight_offset=0.0,
    layout="bthd",
    wants_grad=False,
):
    """Validate everything; returns (q, k, options) with q, k as (B, T, H, D) views.
    wants_grad: autograd will record this call, which in place refuses.

    A plain call (``_plain_key``) is checked in full once per key: a call with a key
    that passed every check skips to the result, as ``validate.check_rope_args``
    does."""
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k: must be a torch.Tensor, got {type(k).__name__}")
    key = _plain_key(
        q, k, w_q, w_k, cos, sin, positions, eps, interleaved, rotary_dim, inplace,
        weight_offset, layout,
    )  # fmt: skip
    passed = None if key is None else _PASSED.get(key)
    if passed is not None:
        R, token = passed
        rope = RopeOptions(
            cos.contiguous(), sin.contiguous(), None, interleaved, R, False,
            QK_NORM_ROPE,
        )  # fmt: skip
        options = QKNormOptions(rope, float(eps), float(weight_offset), token)
        return _as_bthd(q, layout), _as_bthd(k, layout), options
    q4, k4, rope = check_rope_args(
        q,
        k,
        cos,
        sin,
        positions,
        kernel=QK_NORM_ROPE,
        rotary_dim=rotary_dim,
        interleaved=interleaved,
        inplace=inplace,
        layout=layout,
    )
    D = q4.shape[3]
    for name, w in (("w_q", w_q), ("w_k", w_k)):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name}: must be a torch.Tensor, got {type(w).__name__}")
        if w.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: dtype {w.dtype} is not a floating type")
        if tuple(w.shape) != (D,):
            raise ValueError(f"{name}: must be (D,) = {(D,)}, got {tuple(w.shape)}")
        if w.device != q.device:
            raise ValueError(f"{name}: on {w.device}, but q is on {q.device}")
    for name, value in (("eps", eps), ("weight_offset", weight_offset)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}: must be a float, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"{name}: must be finite, got {value}")
    if eps <= 0:
        raise ValueError(f"eps: must be > 0, got {eps}")
    if inplace and wants_grad:
        raise ValueError(
            "inplace: forward only; the backward needs q and k, which in place "
            "overwrites. Pass inplace=False, or call under torch.no_grad()"
        )
    if inplace:
        check_no_overlap(q4, k4, (("w_q", w_q), ("w_k", w_k)))
    token = None
    if key is not None:
        if len(_PASSED) >= 1024:  # a bound for callers that never repeat a shape
            _PASSED.clear()
        token = next(_TOKENS)
        _PASSED[key] = rope.rotary_dim, token
    return q4, k4, QKNormOptions(rope, float(eps), float(weight_offset), token)


# _plain_key -> (the resolved rotary_dim, the key's token) of a plain call that passed
# every check. Tokens are never reused, so a plan kept under one is the key's alone
_PASSED = {}
_TOKENS = itertools.count()


def _plain_key(
    q, k, w_q, w_k, cos, sin, positions, eps, interleaved, rotary_dim, inplace,
    weight_offset, layout,
):  # fmt: skip
    """``validate._plain_key`` for q, k and the tables, and what the weights' and the
    scalars' checks read: the weights' shapes, dtypes and devices, eps and
    weight_offset. That is also all that the launches' plans depend on, with outputs
    and gradients laid out like q and k (``launch_key``; the tuning is added at each
    launch; the SMs are the device's). None for a call that is not plain: validate's
    rules, or a weight that is neither a plain tensor nor a module's ``nn.Parameter``,
    or a scalar that is not an int or a float."""
    weights, numbers = (torch.Tensor, torch.nn.Parameter), (float, int)
    if (
        type(w_q) not in weights
        or type(w_k) not in weights
        or type(eps) not in numbers
        or type(weight_offset) not in numbers
    ):
        return None
    rope_key = _plain_rope_key(
        q, k, cos, sin, positions, QK_NORM_ROPE, rotary_dim, interleaved, inplace,
        layout, False,
    )  # fmt: skip
    if rope_key is None:
        return None
    return (
        rope_key, w_q.shape, w_q.dtype, w_q.device, w_k.shape, w_k.dtype, w_k.device,
        eps, weight_offset,
    )  # fmt: skip


def norm_rotate(q, k, w_q, w_k, options: QKNormOptions):
    """Allocate the outputs (none in place), launch the forward, return (q_out, k_out).
    In place, q's and k's version counters are bumped as torch's own in-place ops bump
    them."""
    rope = options.rope
    q_out, k_out = (
        (q, k) if rope.inplace else (torch.empty_like(q), torch.empty_like(k))
    )
    key = None if options.token is None else (options.token, launcher.FORWARD)
    qk_norm_rope_forward(
        q, k, w_q, w_k, rope.cos, rope.sin, q_out, k_out, key=key,
        **_kernel_options(options),
    )  # fmt: skip
    if rope.inplace:
        torch.autograd.graph.increment_version((q, k))
    return q_out, k_out


def norm_rotate_backward(
    q, k, w_q, w_k, dq_out, dk_out, options: QKNormOptions, key=None
):
    """(dq, dk, dw_q, dw_k) for the forward's inputs q, k and output gradients dq_out,
    dk_out. key: ``prepare_backward``'s, where the gradients are laid out as it
    assumed."""
    rope = options.rope
    return qk_norm_rope_backward(
        q, k, w_q, w_k, rope.cos, rope.sin, dq_out, dk_out, key=key,
        **_kernel_options(options),
    )  # fmt: skip


def prepare_backward(q, k, w_q, w_k, q_out, k_out, options: QKNormOptions):
    """The backward's launch key, computed in the forward for gradients laid out like
    q_out and k_out (strides and dtypes): autograd runs the backward on a thread where
    the same Python costs several times more (chapter 6). A plain call's: its key,
    with ``BACKWARD`` as it is now."""
    if options.token is not None:
        return options.token, launcher.BACKWARD
    rope = options.rope
    return backward_key(
        q, k, w_q, w_k, rope.cos, rope.sin, q_out, k_out, **_kernel_options(options)
    )


def _kernel_options(options: QKNormOptions) -> dict:
    """The keyword arguments both launchers (and ``backward_key``) take from options."""
    rope = options.rope
    return {
        "positions": rope.positions,
        "eps": options.eps,
        "interleaved": rope.interleaved,
        "rotary_dim": rope.rotary_dim,
        "weight_offset": options.weight_offset,
    }


def _validated(
    q,
    k,
    w_q,
    w_k,
    cos,
    sin,
    positions,
    eps,
    interleaved,
    rotary_dim,
    weight_offset,
    inplace=False,
):
    return check_qk_norm_args(
        q,
        k,
        w_q,
        w_k,
        cos,
        sin,
        positions,
        eps=eps,
        interleaved=interleaved,
        rotary_dim=rotary_dim,
        inplace=inplace,
        weight_offset=weight_offset,
    )


@torch.library.custom_op("ropetut::qk_norm_rope", mutates_args=())
def qk_norm_rope(
    q: Tensor,
    k: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Optional[Tensor],
    eps: float,
    interleaved: bool,
    rotary_dim: int,
    weight_offset: float,
) -> tuple[Tensor, Tensor]:
    q4, k4, options = _validated(
        q, k, w_q, w_k, cos, sin, positions, eps, interleaved, rotary_dim, weight_offset
    )
    return norm_rotate(q4, k4, w_q, w_k, options)


@qk_norm_rope.register_fake
def _(q, k, w_q, w_k, cos, sin, positions, eps, interleaved, rotary_dim, weight_offset):
    _validated(
        q, k, w_q, w_k, cos, sin, positions, eps, interleaved, rotary_dim, weight_offset
    )
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("ropetut::qk_norm_rope_backward", mutates_args=())
def qk_norm_rope_backward_op(
    q: Tensor,
    k: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Optional[Tensor],
    dq_out: Tensor,
    dk_out: Tensor,
    eps: float,
    interleaved: bool,
    rotary_dim: int,
    weight_offset: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    q4, k4, options = _validated(
        q, k, w_q, w_k, cos, sin, positions, eps, interleaved, rotary_dim, weight_offset
    )
    _check_gradients(q4, k4, dq_out, dk_out)
    return norm_rotate_backward(q4, k4, w_q, w_k, dq_out, dk_out, options)


@qk_norm_rope_backward_op.register_fake
def _(
    q,
    k,
    w_q,
    w_k,
    cos,
    sin,
    positions,
    dq_out,
    dk_out,
    eps,
    interleaved,
    rotary_dim,
    weight_offset,
):
    _validated(
        q, k, w_q, w_k, cos, sin, positions, eps, interleaved, rotary_dim, weight_offset
    )
    _check_gradients(q, k, dq_out, dk_out)
    return (
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(w_q),
        torch.empty_like(w_k),
    )


def _check_gradients(q, k, dq_out, dk_out):
    for name, grad, x in (("dq_out", dq_out, q), ("dk_out", dk_out, k)):
        if grad.shape != x.shape or grad.device != x.device:
            raise ValueError(
                f"{name}: must match the forward's input, shape "
                f"{tuple(x.shape)} on {x.device}, got {tuple(grad.shape)} on "
                f"{grad.device}"
            )


def _save_for_backward(ctx, inputs, output):
    q, k, w_q, w_k, cos, sin, positions, *options = inputs
    for i, name in ((4, "cos"), (5, "sin")):  # as check_rope_args refuses them
        if ctx.needs_input_grad[i]:
            raise ValueError(
                f"{name}: requires grad, but ropetut computes no gradient for "
                f"the tables; pass {name}.detach()"
            )
    ctx.save_for_backward(q, k, w_q, w_k, cos, sin, positions)
    ctx.options = options


def _backward(ctx, dq_out, dk_out):
    grads = qk_norm_rope_backward_op(*ctx.saved_tensors, dq_out, dk_out, *ctx.options)
    return (*grads, None, None, None, None, None, None, None)


qk_norm_rope.register_autograd(_backward, setup_context=_save_for_backward)


@torch.library.custom_op("ropetut::qk_norm_rope_", mutates_args=("q", "k"))
def qk_norm_rope_(
    q: Tensor,
    k: Tensor,
    w_q: Tensor,
    w_k: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Optional[Tensor],
    eps: float,
    interleaved: bool,
    rotary_dim: int,
    weight_offset: float,
) -> None:
    q4, k4, options = _validated(
        q,
        k,
        w_q,
        w_k,
        cos,
        sin,
        positions,
        eps,
        interleaved,
        rotary_dim,
        weight_offset,
        inplace=True,
    )
    norm_rotate(q4, k4, w_q, w_k, options)


@qk_norm_rope_.register_fake
def _(q, k, w_q, w_k, cos, sin, positions, eps, interleaved, rotary_dim, weight_offset):
    _validated(
        q,
        k,
        w_q,
        w_k,
        cos,
        sin,
        positions,
        eps,
        interleaved,
        rotary_dim,
        weight_offset,
        inplace=True,
    )


def qk_norm_rope_traced(q, k, w_q, w_k, options: QKNormOptions):
    """What ``apply_qk_norm_rope`` calls under ``torch.compile``, on validated views."""
    rope = options.rope
    args = (
        w_q,
        w_k,
        rope.cos,
        rope.sin,
        rope.positions,
        options.eps,
        rope.interleaved,
        rope.rotary_dim,
        options.weight_offset,
    )
    if rope.inplace:  # (with a gradient, check_qk_norm_args refused it)
        qk_norm_rope_(q, k, *args)
        return q, k
    return qk_norm_rope(q, k, *args)
