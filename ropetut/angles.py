"""``apply_rope_angles``: RoPE with no table. The kernel computes each angle from
``inv_freq`` and the token's position (``ropetut/kernels/angles.py`` says how): the
host only checks the arguments and launches, on every path.

It is a module of its own, not a ``KERNELS`` entry: a registry launcher takes cos and
sin tables, and this one takes frequencies instead. The paths are ``apply_rope``'s:
validation, then eagerly an autograd.Function whose backward is the same kernel turning
by -theta, or a bare launch with no gradient to track; under ``torch.compile``, the
operators of ``ropetut.angles_op``.
"""

import torch

from .angles_op import check_angle_args, rope_angles_traced, rotate_angles
from .autograd import (
    EARLY_GRADS_BYTES,
    empty_strided_like,
    save_for_backward,
    saved_tensors,
)
from .kernels.angles import launch_key
from .kernels.angles import rope_angles as launch_angles


class AnglesFunction(torch.autograd.Function):
    """q: (B, T, Hq, D), k: (B, T, Hkv, D) or None; inv_freq: (rotary_dim/2,);
    options: (positions, interleaved, rotary_dim, inplace, backward). Returns q_out or
    (q_out, k_out). No gradient flows to inv_freq or positions; both are saved, so a
    write to one in place before the backward raises there.

    The backward runs on autograd's own thread for the GPU, where the same Python costs
    several times what it costs on the caller's (chapter 6), so the forward computes the
    backward's launch key ahead, as ``RopeFunction`` does for ``final``: for output
    gradients laid out like the outputs (the usual case), into input gradients laid out
    like them too, gaps and all (in place on a tensor with gaps between its rows, where
    ``empty_like`` would be contiguous); any other layout, or a backward that autograd
    records, takes the ordinary path. For tensors of at most ``EARLY_GRADS_BYTES``,
    where host time is all there is, the forward makes the input gradients' memory too,
    as ``RopeFunction`` does."""

    @staticmethod
    def forward(ctx, q, k, inv_freq, options):
        q_out, k_out = rotate_angles(q, k, inv_freq, options)
        positions, interleaved, rotary_dim, inplace, backward = options
        if inplace:
            ctx.mark_dirty(*(t for t in (q, k) if t is not None))
        save_for_backward(ctx, inv_freq, positions)
        ctx.options = options
        ctx.prepared = ctx.grads = None
        if not backward and q.numel() and (k is None or k.numel()):
            ctx.prepared = launch_key(
                q_out, k_out, inv_freq, q_out, k_out, positions, rotary_dim,
                interleaved, True, in_place=False,
            )  # fmt: skip
            ctx.grad_strides = (q_out.stride(), None if k is None else k_out.stride())
            if q.nbytes + (0 if k is None else k.nbytes) <= EARLY_GRADS_BYTES:
                ctx.grads = (
                    empty_strided_like(q_out),
                    None if k is None else empty_strided_like(k_out),
                )
        return q_out if k is None else (q_out, k_out)

    @staticmethod
    def backward(ctx, dq, dk=None):
        inv_freq, positions = saved_tensors(ctx)
        _, interleaved, rotary_dim, _, backward = ctx.options
        if (
            ctx.prepared is not None
            and not torch.is_grad_enabled()
            and ctx.grad_strides == (dq.stride(), None if dk is None else dk.stride())
        ):  # with the outputs' strides, as the prepared launch expects (no overlap:
            # out of place the outputs are dense, and in place may not overlap)
            # once only: a second backward (retain_graph) gets fresh memory
            grads, ctx.grads = ctx.grads, None
            if grads is None:
                grads = (
                    empty_strided_like(dq),
                    None if dk is None else empty_strided_like(dk),
                )
            launch_angles(
                dq, dk, inv_freq, *grads, positions=positions,
                interleaved=interleaved, rotary_dim=rotary_dim, backward=True,
                key=ctx.prepared,
            )  # fmt: skip
            return (*grads, None, None)
        back = (positions, interleaved, rotary_dim, False, not backward)
        if torch.is_grad_enabled():  # create_graph=True: differentiable, through here
            grads = AnglesFunction.apply(dq, dk, inv_freq, back)
            return (grads, None, None, None) if dk is None else (*grads, None, None)
        return (*rotate_angles(dq, dk, inv_freq, back), None, None)


def apply_rope_angles(q, k=None, inv_freq=None, *, positions=None, interleaved=False,
                      rotary_dim=None, inplace=False, layout="bthd"):  # fmt: skip
    """Rotate q (and k) by ``position * inv_freq``, computed in the kernel: no table.

    q, k, positions, interleaved, rotary_dim, inplace, layout: as ``apply_rope``.
    Positions are int64 (or int32) values in [0, 2**36): a token outside gets NaN.
    inv_freq: (rotary_dim/2,) float32 or float64 frequencies, e.g. from
       ``ropetut.scaling``; float64 keeps the frequencies' own low bits. Multiply the
       output by a variant's ``attention_factor`` where it is not 1.
    Returns (q_out, k_out), or q_out alone when k is None. Never waits for the GPU."""
    wants_grad = torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
    )
    q4, k4, options = check_angle_args(
        q, k, inv_freq, positions, interleaved=interleaved, rotary_dim=rotary_dim,
        inplace=inplace, layout=layout, wants_grad=wants_grad,
    )  # fmt: skip
    if torch.compiler.is_compiling():
        q_out, k_out = rope_angles_traced(q4, k4, inv_freq, options, wants_grad)
    elif not wants_grad:
        q_out, k_out = rotate_angles(q4, k4, inv_freq, options)
    elif inplace and k is not None:  # (autograd: one view written per call)
        q_out = AnglesFunction.apply(q4, None, inv_freq, options)
        k_out = AnglesFunction.apply(k4, None, inv_freq, options)
    elif k is None:
        q_out, k_out = AnglesFunction.apply(q4, None, inv_freq, options), None
    else:
        q_out, k_out = AnglesFunction.apply(q4, k4, inv_freq, options)
    if layout == "bhtd":
        q_out = q_out.transpose(1, 2)
        k_out = None if k_out is None else k_out.transpose(1, 2)
    return q_out if k is None else (q_out, k_out)
