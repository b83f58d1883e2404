"""``apply_qk_norm_rope``: RMSNorm each head of q and k, weight it, RoPE, in one kernel.

The paths are ``apply_rope``'s: eagerly, an ``autograd.Function``
(``QKNormRopeFunction``) whose forward and backward each launch one kernel, or a bare
launch with no gradient to track; under ``torch.compile``, the operators of
``ropetut.qk_norm_op``. Neither reads a tensor's values on the host, so neither waits
for the GPU. ``QKNormRotary`` is the module for models; ``QKNormThenRope`` is the
unfused pair it replaces (a norm, then any rope module), for comparison.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .autograd import save_for_backward, saved_tensors
from .qk_norm_op import (
    QKNormOptions,
    check_qk_norm_args,
    norm_rotate,
    norm_rotate_backward,
    prepare_backward,
    qk_norm_rope_traced,
)
from .tables import PRESETS, rope_tables


class QKNormRopeFunction(torch.autograd.Function):
    """q: (B, T, Hq, D), k: (B, T, Hkv, D), any strides; w_q, w_k: (D,); ``options``: a
    ``QKNormOptions`` (out of place: in place has no backward). Returns (q_out, k_out).
    Saves q, k, the weights, the tables and positions (a write to one in place before
    the backward raises there); the backward recomputes the norm from them (see
    ``ropetut/kernels/qk_norm_rope.py``). Differentiable once.

    The forward computes the backward's launch key ahead (``prepare_backward``), for
    gradients laid out like q_out and k_out, as ``RopeFunction`` does for ``final``;
    gradients laid out otherwise, or q and k that saved-tensor hooks gave back laid
    out otherwise, get their own key in the backward."""

    @staticmethod
    def forward(ctx, q, k, w_q, w_k, options: QKNormOptions):
        rope = options.rope
        save_for_backward(ctx, q, k, w_q, w_k, rope.cos, rope.sin, rope.positions)
        ctx.options = options
        q_out, k_out = norm_rotate(q, k, w_q, w_k, options)
        ctx.grad_layout = (q.stride(), k.stride(), q_out.stride(), k_out.stride(),
                           q_out.dtype, k_out.dtype)  # fmt: skip
        ctx.backward_key = prepare_backward(q, k, w_q, w_k, q_out, k_out, options)
        return q_out, k_out

    @staticmethod
    @once_differentiable
    def backward(ctx, dq_out, dk_out):
        q, k, w_q, w_k, cos, sin, positions = saved_tensors(ctx)
        options, rope = ctx.options, ctx.options.rope
        # the saved tables and positions are the forward's own tensors unless
        # saved-tensor hooks made copies: then the copies are what the forward read
        if not (cos is rope.cos and sin is rope.sin and positions is rope.positions):
            rope = rope._replace(cos=cos, sin=sin, positions=positions)
            options = options._replace(rope=rope)
        # the key assumed q and k as the forward had them (a hook may lay them out
        # anew) and gradients laid out like the outputs
        layout = (q.stride(), k.stride(), dq_out.stride(), dk_out.stride(),
                  dq_out.dtype, dk_out.dtype)  # fmt: skip
        key = ctx.backward_key if layout == ctx.grad_layout else None
        grads = norm_rotate_backward(q, k, w_q, w_k, dq_out, dk_out, options, key)
        return (*grads, None)


def apply_qk_norm_rope(
    q,
    k,
    w_q,
    w_k,
    cos,
    sin,
    *,
    eps=1e-6,
    positions=None,
    interleaved=False,
    rotary_dim=None,
    inplace=False,
    weight_offset=0.0,
    layout="bthd",
):
    """y = RoPE(RMSNorm(x) * (w + weight_offset)) for x = q with w_q and x = k with w_k,
    the norm over each head's D dims (as Qwen3 and Gemma 3 do before RoPE).
    Differentiable once in q, k, w_q and w_k; never waits for the GPU.

    q: (B, T, Hq, D) for layout "bthd", (B, H, T, D) for "bhtd"; any strides.
    k: like q with Hkv heads, Hq a multiple of Hkv (GQA).
    w_q, w_k: (D,) weights, any float dtype (their gradients come back in it).
    cos, sin: (n_positions, rotary_dim/2) tables, see ``ropetut.rope_tables``.
    eps: added to the mean square, > 0. Statistics are computed in fp32 (fp64 for fp64).
    positions, interleaved, rotary_dim, layout: as ``apply_rope``. With rotary_dim < D
       the norm still covers all D dims; only the first rotary_dim turn.
    weight_offset: 1.0 for Gemma's (1 + w) weights; 0.0 (default) for Qwen3's w.
    inplace: overwrite q and k. Forward only: refused when q, k or a weight requires
       grad (with grad enabled), since the backward needs the q and k it overwrites.
    Returns (q_out, k_out), shaped and laid out like the inputs.
    """
    wants_grad = torch.is_grad_enabled() and (  # (no generator: host time)
        getattr(q, "requires_grad", False)
        or getattr(k, "requires_grad", False)
        or getattr(w_q, "requires_grad", False)
        or getattr(w_k, "requires_grad", False)
    )
    q4, k4, options = check_qk_norm_args(
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
        layout=layout,
        wants_grad=wants_grad,
    )
    if torch.compiler.is_compiling():
        q_out, k_out = qk_norm_rope_traced(q4, k4, w_q, w_k, options)
    elif wants_grad:
        q_out, k_out = QKNormRopeFunction.apply(q4, k4, w_q, w_k, options)
    else:
        q_out, k_out = norm_rotate(q4, k4, w_q, w_k, options)
    if layout == "bhtd":
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return q_out, k_out


class QKNormRotary(nn.Module):
    """Qwen3's q_norm and k_norm, then RoPE, as one module: two (D,) weights (ones, or
    zeros with ``weight_offset=1.0``, Gemma's convention) and the cos/sin tables of
    ``preset``, stored in ``table_dtype``. Called as ``rope(q, k, positions=...)``, so
    it fits ``RoPEAttention(rope=...)``."""

    def __init__(
        self,
        head_dim: int,
        max_seq_len: int,
        *,
        eps: float = 1e-6,
        weight_offset: float = 0.0,
        preset: str = "standard",
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        layout: str = "bthd",
        table_dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if preset not in PRESETS:
            raise ValueError(f"preset: must be one of {tuple(PRESETS)}, got {preset!r}")
        freqs = PRESETS[preset](rotary_dim or head_dim, base)
        cos, sin = rope_tables(freqs, max_seq_len, dtype=table_dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        init = torch.zeros if weight_offset else torch.ones
        self.w_q = nn.Parameter(init(head_dim))
        self.w_k = nn.Parameter(init(head_dim))
        self.eps, self.weight_offset, self.rotary_dim = eps, weight_offset, rotary_dim
        self.interleaved, self.layout = interleaved, layout

    def forward(self, q, k, *, positions=None, inplace: bool = False):
        return apply_qk_norm_rope(
            q,
            k,
            self.w_q,
            self.w_k,
            self.cos,
            self.sin,
            eps=self.eps,
            positions=positions,
            interleaved=self.interleaved,
            rotary_dim=self.rotary_dim,
            inplace=inplace,
            weight_offset=self.weight_offset,
            layout=self.layout,
        )


class QKNormThenRope(nn.Module):
    """The unfused pair: an RMSNorm over each head of q and of k (weights w_q, w_k of
    size D, ones at first; statistics in fp32, the result in the input's dtype), then
    ``rope``, any module called as ``rope(q, k, positions=...)`` on (B, T, H, D)
    tensors. Two passes each way where ``QKNormRotary`` makes one."""

    def __init__(self, head_dim: int, rope: nn.Module, *, eps: float = 1e-6):
        super().__init__()
        self.w_q = nn.Parameter(torch.ones(head_dim))
        self.w_k = nn.Parameter(torch.ones(head_dim))
        self.rope, self.eps = rope, eps

    def norm(self, x, w):
        return F.rms_norm(x.float(), x.shape[-1:], w.float(), self.eps).to(x.dtype)

    def forward(self, q, k, positions=None):
        q, k = self.norm(q, self.w_q), self.norm(k, self.w_k)
        return self.rope(q, k, positions=positions)
