"""Table-free RoPE's checks, and its operators: what ``torch.compile`` sees.

- ``check_angle_args``: ``validate.check_rope_args`` with frequencies in place of the
  tables; ``TypeError``/``ValueError`` naming the argument, before anything is written.
  It never reads a tensor's values (no wait for the GPU).
- ``torch.ops.ropetut.rope_angles``: out of place, returns (q_out, k_out),
  differentiable, twice too: its backward is the operator turning by -theta;
- ``torch.ops.ropetut.rope_angles_``: in place, declares that it writes q and k.
  Autograd cannot go through an operator that mutates its inputs: no gradient.

As in ``ropetut.op``: q and k are (B, T, H, D) views, any strides; each operator
validates its arguments as ``apply_rope_angles`` does, and has a fake implementation
(the outputs' shapes, strides and dtypes, computed without launching anything), so the
compiler traces around it as one opaque node. The operators take inv_freq and hand it
to the kernel, which computes its angles from it. ``apply_rope_angles`` calls them only
when it is being traced, and the launcher directly otherwise.
"""

from typing import Optional

import torch
from torch import Tensor

from .kernels.angles import rope_angles as launch_angles
from .validate import (
    _as_bthd,
    check_device,
    check_inplace_writes,
    check_positions_arg,
    check_qk,
)


def check_angle_args(q, k, inv_freq, positions, *, interleaved, rotary_dim, inplace,
                     layout, wants_grad):  # fmt: skip
    """As ``validate.check_rope_args``, with inv_freq for the tables: TypeError or
    ValueError naming the argument, before anything is written; it never reads a
    tensor's values. Returns (q, k) as (B, T, H, D) views and the options tuple,
    (positions as (B, T) or None, interleaved, rotary_dim, inplace, backward=False).
    wants_grad: autograd will record this call (in place, its refusals are checked).

    A plain call (dense torch tensors, out of place, no positions, eager) is checked in
    full once per ``_plain_key``, as ``validate.check_rope_args`` checks the table's: a
    call with a key that passed every check skips to the result (host time)."""
    key = _plain_key(
        q, k, inv_freq, positions, interleaved, rotary_dim, inplace, layout
    )
    R = None if key is None else _PASSED.get(key)
    if R is not None:
        return (
            _as_bthd(q, layout), None if k is None else _as_bthd(k, layout),
            (None, interleaved, R, False, False),
        )  # fmt: skip
    q4, k4, R = check_qk(
        q, k, layout=layout, rotary_dim=rotary_dim,
        flags=(("interleaved", interleaved), ("inplace", inplace)),
    )  # fmt: skip
    B, T = q4.shape[:2]
    if not isinstance(inv_freq, torch.Tensor):
        raise TypeError(
            f"inv_freq: must be a torch.Tensor, got {type(inv_freq).__name__}"
        )
    if inv_freq.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"inv_freq: dtype must be float32 or float64, got {inv_freq.dtype}"
        )
    if tuple(inv_freq.shape) != (R // 2,):
        raise ValueError(
            f"inv_freq: must be (rotary_dim/2,) = {(R // 2,)}, got "
            f"{tuple(inv_freq.shape)}"
        )
    if inv_freq.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "inv_freq: requires grad, but no gradient flows to it; detach it"
        )
    if positions is not None:
        check_positions_arg(positions, B, T)
    check_device(q, (("k", k), ("inv_freq", inv_freq), ("positions", positions)))
    if inplace:
        check_inplace_writes(
            q, k, q4, k4, (("inv_freq", inv_freq), ("positions", positions)),
            wants_grad=wants_grad,
        )  # fmt: skip
    positions = None if positions is None else positions.expand(B, T)
    if key is not None:
        if len(_PASSED) >= 1024:  # a bound for callers that never repeat a shape
            _PASSED.clear()
        _PASSED[key] = R
    return q4, k4, (positions, interleaved, R, inplace, False)


# _plain_key -> the resolved rotary_dim of a plain call that passed every check
_PASSED = {}


def _plain_key(q, k, inv_freq, positions, interleaved, rotary_dim, inplace, layout):
    """What every check of a plain call reads: types, shapes, strides, dtypes, devices
    and the options, and whether inv_freq requires grad where autograd would record
    the call. None for any other call: in place (addresses, version counters),
    positions, a tensor subclass, tracing."""
    tensor = torch.Tensor
    if (
        inplace is not False
        or positions is not None
        or not (interleaved is True or interleaved is False)
        or type(layout) is not str
        or type(q) is not tensor
        or type(inv_freq) is not tensor
        or not (k is None or type(k) is tensor)
        or type(rotary_dim) not in (int, type(None))
        or torch.compiler.is_compiling()
    ):
        return None
    return (
        layout, rotary_dim, interleaved, q.shape, q.stride(), q.dtype, q.device,
        None if k is None else (k.shape, k.stride(), k.dtype, k.device),
        inv_freq.shape, inv_freq.stride(), inv_freq.dtype, inv_freq.device,
        inv_freq.requires_grad and torch.is_grad_enabled(),
    )  # fmt: skip


def rotate_angles(q, k, inv_freq, options):
    """Allocate the outputs (none in place) and launch; returns (q_out, k_out). q, k and
    options come from ``check_angle_args``, which checks inv_freq too. An empty q or k
    launches nothing for it. In place, q's and k's version counters are bumped, as
    torch's own in-place ops bump them."""
    positions, interleaved, rotary_dim, inplace, backward = options
    q_out = q if inplace else torch.empty_like(q)
    k_out = None if k is None else (k if inplace else torch.empty_like(k))
    x, x_out, y, y_out = q, q_out, k, k_out
    if k is not None and not k.numel():  # an empty k: q alone
        y = y_out = None
    elif not q.numel():  # an empty q: k alone (or nothing)
        x, x_out, y, y_out = k, k_out, None, None
    if x is not None and x.numel():
        launch_angles(x, y, inv_freq, x_out, y_out, positions=positions,
                      interleaved=interleaved, rotary_dim=rotary_dim,
                      backward=backward)  # fmt: skip
    if inplace:
        torch.autograd.graph.increment_version(q if k is None else (q, k))
    return q_out, k_out


def _validated(q, k, inv_freq, positions, interleaved, rotary_dim, inplace, backward):
    """The operator's arguments, checked as ``apply_rope_angles`` checks them: (q, k,
    options), q and k (B, T, H, D)."""
    q, k, options = check_angle_args(
        q, k, inv_freq, positions, interleaved=interleaved, rotary_dim=rotary_dim,
        inplace=inplace, layout="bthd", wants_grad=False,
    )  # fmt: skip
    return q, k, (*options[:4], backward)


# The schema is read from the type hints. An operator returns a fixed number of tensors,
# so without k the second output is an empty tensor.
@torch.library.custom_op("ropetut::rope_angles", mutates_args=())
def rope_angles(q: Tensor, k: Optional[Tensor], inv_freq: Tensor,
                positions: Optional[Tensor], interleaved: bool, rotary_dim: int,
                backward: bool) -> tuple[Tensor, Tensor]:  # fmt: skip
    q, k, options = _validated(
        q, k, inv_freq, positions, interleaved, rotary_dim, False, backward
    )
    q_out, k_out = rotate_angles(q, k, inv_freq, options)
    return q_out, q.new_empty(0) if k_out is None else k_out


@rope_angles.register_fake
def _(q, k, inv_freq, positions, interleaved, rotary_dim, backward):
    _validated(q, k, inv_freq, positions, interleaved, rotary_dim, False, backward)
    return torch.empty_like(q), q.new_empty(0) if k is None else torch.empty_like(k)


def _save_for_backward(ctx, inputs, output):
    _, k, inv_freq, positions, interleaved, rotary_dim, backward = inputs
    if ctx.needs_input_grad[2]:  # as apply_rope_angles refuses it
        raise ValueError(
            "inv_freq: requires grad, but no gradient flows to it; detach it"
        )
    ctx.save_for_backward(inv_freq, positions)
    ctx.options = (k is not None, interleaved, rotary_dim, backward)


def _backward(ctx, dq, dk):
    """The gradient of a turn by theta is the turn by -theta: ``rope_angles`` again, so
    differentiable."""
    inv_freq, positions = ctx.saved_tensors
    has_k, interleaved, rotary_dim, backward = ctx.options
    dq_in, dk_in = rope_angles(dq, dk if has_k else None, inv_freq, positions,
                               interleaved, rotary_dim, not backward)  # fmt: skip
    return dq_in, dk_in if has_k else None, None, None, None, None, None


rope_angles.register_autograd(_backward, setup_context=_save_for_backward)


@torch.library.custom_op("ropetut::rope_angles_", mutates_args=("q", "k"))
def rope_angles_(q: Tensor, k: Optional[Tensor], inv_freq: Tensor,
                 positions: Optional[Tensor], interleaved: bool,
                 rotary_dim: int) -> None:  # fmt: skip
    q, k, options = _validated(
        q, k, inv_freq, positions, interleaved, rotary_dim, True, False
    )
    rotate_angles(q, k, inv_freq, options)


@rope_angles_.register_fake
def _(q, k, inv_freq, positions, interleaved, rotary_dim):
    _validated(q, k, inv_freq, positions, interleaved, rotary_dim, True, False)


def rope_angles_traced(q, k, inv_freq, options, wants_grad):
    """What ``apply_rope_angles`` calls under ``torch.compile``, on validated
    (B, T, H, D) views."""
    positions, interleaved, rotary_dim, inplace, _ = options
    if inplace and not wants_grad:
        rope_angles_(q, k, inv_freq, positions, interleaved, rotary_dim)
        return q, k
    q_out, k_out = rope_angles(
        q, k, inv_freq, positions, interleaved, rotary_dim, False
    )
    k_out = None if k is None else k_out
    if inplace:  # with a gradient, autograd cannot go through rope_angles_: copy back
        q.copy_(q_out)
        if k is not None:
            k.copy_(k_out)
        return q, k
    return q_out, k_out
