"""``apply_rope``: the public entry point. Validation, then a ``torch.autograd.Function`` whose
forward and backward both launch a kernel: the backward of a rotation by theta is the rotation
by -theta, so the gradient costs exactly what the forward costs.
"""
import torch

from .kernels.final import rope_final
from .kernels.v1 import rope_v1
from .kernels.v2 import rope_v2
from .kernels.v3 import rope_v3
from .kernels.v4 import rope_v4
from .launch import check_rope_args

IMPLS = ("v1", "v2", "v3", "v4", "final")
_SINGLE_TENSOR = {"v1": rope_v1, "v2": rope_v2, "v3": rope_v3}


def run_kernel(impl, q, k, cos, sin, q_out, k_out, *, positions=None, interleaved=False,
               rotary_dim=None, backward=False):
    """Launch one version's kernel on validated (B, T, H, D) views, writing q_out and k_out."""
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


def _rotate(q, k, cos, sin, positions, interleaved, rotary_dim, inplace, impl):
    q_out = q if inplace else torch.empty_like(q)
    k_out = None if k is None else (k if inplace else torch.empty_like(k))
    return run_kernel(impl, q, k, cos, sin, q_out, k_out, positions=positions,
                      interleaved=interleaved, rotary_dim=rotary_dim)


class RopeFunction(torch.autograd.Function):
    """q: (B, T, Hq, D), k: (B, T, Hkv, D) or None, any strides. No gradient flows to the tables."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, positions, interleaved, rotary_dim, inplace, impl):
        q_out, k_out = _rotate(q, k, cos, sin, positions, interleaved, rotary_dim, inplace, impl)
        if inplace:
            ctx.mark_dirty(*(t for t in (q, k) if t is not None))
        ctx.save_for_backward(cos, sin, positions)
        ctx.options = (interleaved, rotary_dim, impl, k is not None)
        return q_out, k_out

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin, positions = ctx.saved_tensors
        interleaved, rotary_dim, impl, has_k = ctx.options
        dk = dk if has_k else None
        dq_in = torch.empty_like(dq)
        dk_in = None if dk is None else torch.empty_like(dk)
        run_kernel(impl, dq, dk, cos, sin, dq_in, dk_in, positions=positions,
                   interleaved=interleaved, rotary_dim=rotary_dim, backward=True)
        return dq_in, dk_in, None, None, None, None, None, None, None


def apply_rope(q, k=None, cos=None, sin=None, *, positions=None, interleaved=False,
               rotary_dim=None, inplace=False, layout="bthd", impl="final"):
    """Rotate q (and k) by their positions. Differentiable.

    q: (B, T, Hq, D) for layout "bthd" (the seed's), (B, H, T, D) for "bhtd" (Hugging Face's);
       any strides, so a transposed view works without a copy.
    k: like q with Hkv heads, Hq a multiple of Hkv (GQA), or None.
    cos, sin: (n_positions, rotary_dim/2) tables, see ``ropetut.rope_tables``.
    positions: None (token t at position t), or (T,) / (B, T) integers indexing the table rows.
    interleaved: pairs (x[2i], x[2i+1]) (GPT-J) instead of (x[i], x[i + rotary_dim/2]) (NeoX).
    rotary_dim: rotate only the first rotary_dim dims (default D); the rest pass through.
    inplace: overwrite q and k instead of allocating outputs.
    impl: "final" (default) or one of the teaching versions "v1".."v4", which refuse what they
       can't do: v1 has only interleaved pairs, v2-v4 only half-split ones, and none of them
       takes positions, rotary_dim or inplace.
    Returns (q_out, k_out), or q_out alone when k is None, shaped and laid out like the inputs.
    """
    if cos is None or sin is None:
        raise TypeError("cos, sin: both tables are required (see ropetut.rope_tables)")
    if impl not in IMPLS:
        raise ValueError(f"impl: must be one of {IMPLS}, got {impl!r}")
    args = check_rope_args(q, k, cos, sin, positions, rotary_dim=rotary_dim,
                           interleaved=interleaved, inplace=inplace, layout=layout)
    if impl != "final":
        _check_impl_supports(impl, args, positions, rotary_dim, interleaved, inplace)
    inputs = (args.q, args.k, args.cos, args.sin, args.positions, interleaved, args.rotary_dim, inplace, impl)
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad))
    # Without a gradient to track, skip autograd's bookkeeping: it costs more host time than a
    # small shape's whole kernel.
    q_out, k_out = RopeFunction.apply(*inputs) if wants_grad else _rotate(*inputs)
    if layout == "bhtd":
        q_out = q_out.transpose(1, 2)
        k_out = None if k_out is None else k_out.transpose(1, 2)
    return q_out if k is None else (q_out, k_out)


def _check_impl_supports(impl, args, positions, rotary_dim, interleaved, inplace):
    D = args.q.shape[-1]
    for name, asked in (("positions", positions is not None), ("inplace", inplace),
                        ("rotary_dim", args.rotary_dim != D)):
        if asked:
            raise ValueError(f"{name}: impl={impl!r} does not support it; use impl='final'")
    if interleaved != (impl == "v1"):
        pairs = "interleaved" if impl == "v1" else "half-split"
        raise ValueError(f"interleaved: impl={impl!r} only has {pairs} pairs; use impl='final'")
