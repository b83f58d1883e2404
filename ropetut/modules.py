"""Modules: ``RotaryEmbedding`` (tables + apply_rope) and a small causal
``RoPEAttention``."""

import torch
import torch.nn.functional as F
from torch import nn

from .autograd import apply_rope
from .tables import PRESETS, rope_tables


class RotaryEmbedding(nn.Module):
    """Holds cos/sin tables for one frequency preset and applies them with
    ``apply_rope``.

    preset: "standard", "half_truncated" (the seed's) or "partial" (needs rotary_dim).
    table_dtype: dtype of the stored tables (float32 unless you are studying precision).
    """

    def __init__(
        self,
        head_dim: int,
        max_seq_len: int,
        *,
        preset: str = "standard",
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        table_dtype: torch.dtype = torch.float32,
        layout: str = "bthd",
        impl: str = "final",
    ):
        super().__init__()
        if preset not in PRESETS:
            raise ValueError(f"preset: must be one of {tuple(PRESETS)}, got {preset!r}")
        if preset == "partial":
            if rotary_dim is None:
                raise ValueError("rotary_dim: the 'partial' preset needs it")
            freqs = PRESETS[preset](rotary_dim, base)
        else:
            if rotary_dim not in (None, head_dim):
                raise ValueError(
                    f"rotary_dim: only the 'partial' preset takes it, got {rotary_dim}"
                )
            freqs = PRESETS[preset](head_dim, base)
        cos, sin = rope_tables(freqs, max_seq_len, dtype=table_dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.rotary_dim, self.interleaved = rotary_dim, interleaved
        self.layout, self.impl = layout, impl

    def forward(self, q, k=None, *, positions=None, inplace: bool = False):
        return apply_rope(
            q,
            k,
            self.cos,
            self.sin,
            positions=positions,
            interleaved=self.interleaved,
            rotary_dim=self.rotary_dim,
            inplace=inplace,
            layout=self.layout,
            impl=self.impl,
        )


class RoPEAttention(nn.Module):
    """Causal multi-head attention with RoPE on q and k, and optional GQA
    (n_kv_heads < n_heads).

    rope: any module called as ``rope(q, k, positions=...)`` on (B, T, H, D) tensors and
    returning (q, k); a ``RotaryEmbedding`` by default. This is the hook the training
    chapter uses to swap positional schemes.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        max_seq_len: int = 2048,
        rope: nn.Module | None = None,
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads: {n_heads} does not divide d_model={d_model}")
        n_kv_heads = n_kv_heads or n_heads
        if n_heads % n_kv_heads:
            raise ValueError(
                f"n_kv_heads: {n_kv_heads} does not divide n_heads={n_heads}"
            )
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wkv = nn.Linear(d_model, 2 * n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)
        self.rope = (
            rope if rope is not None else RotaryEmbedding(self.head_dim, max_seq_len)
        )

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k, v = self.wkv(x).view(B, T, 2, self.n_kv_heads, self.head_dim).unbind(2)
        q, k = self.rope(q, k, positions=positions)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D) for SDPA
        repeat = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, C))
