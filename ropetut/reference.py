"""The seed's PyTorch baseline, an HF-style peer, and the float64 reference every test
trusts."""

import torch
from torch import nn

from .tables import half_truncated


class LlmRotary(nn.Module):
    """The seed's ``Rotary`` from ``llm.py`` (002), kept bug for bug.

    - frequencies: the half-truncated spectrum, so the last head_dim/4 pairs never
      rotate;
    - angles ``t * freq`` computed in float32; cos/sin buffers of shape
      (max_seq_len, head_dim/2);
    - half-split pairs (x[i], x[i + D/2]), turned by -theta: ``y1 = x1*cos + x2*sin``;
    - input (B, T, H, D). Fed (B, H, T, D) it silently rotates by *head index* instead.

    ``compute_dtype=torch.float32`` (the seed's final version) computes in fp32 and
    casts back; ``compute_dtype=None`` computes in the input's dtype, tables included
    (its early fp16 version).
    """

    def __init__(
        self,
        dim: int,
        max_seq_len: int,
        base: float = 10000.0,
        compute_dtype: torch.dtype | None = torch.float32,
    ):
        super().__init__()
        angular_freq = half_truncated(dim, base).float()
        t = torch.arange(max_seq_len, dtype=torch.float32)
        theta = torch.einsum("i,j -> ij", t, angular_freq)
        self.register_buffer("cos", theta.cos(), persistent=False)
        self.register_buffer("sin", theta.sin(), persistent=False)
        self.compute_dtype = compute_dtype

    def forward(self, x_BTHD: torch.Tensor) -> torch.Tensor:
        assert self.cos.size(0) >= x_BTHD.size(-3)
        dtype = self.compute_dtype or x_BTHD.dtype
        cos = self.cos[None, : x_BTHD.size(-3), None, :].to(dtype)
        sin = self.sin[None, : x_BTHD.size(-3), None, :].to(dtype)
        x1, x2 = x_BTHD.to(dtype=dtype).chunk(2, dim=-1)
        y1 = x1 * cos + x2 * sin
        y2 = x1 * (-sin) + x2 * cos
        return torch.cat((y1, y2), 3).type_as(x_BTHD)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_rotate_half(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
):
    """Hugging Face's formulation on (B, H, T, D): ``x*cos + rotate_half(x)*sin`` with
    full-width tables (each half's angles repeated). Computes in the promoted dtype of
    x and the tables."""
    T = q.shape[-2]
    cos = torch.cat((cos[:T], cos[:T]), dim=-1)
    sin = torch.cat((sin[:T], sin[:T]), dim=-1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rope_reference(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    positions=None,
    interleaved: bool = False,
    rotary_dim: int | None = None,
    layout: str = "bthd",
    inverse: bool = False,
) -> torch.Tensor:
    """Standard RoPE (pair turned by +theta) in float64 on x's device (tables and
    positions follow x). Returns float64; differentiable.

    x: (B, T, H, D) for layout "bthd", (B, H, T, D) for "bhtd".
    cos, sin: (n_positions, rotary_dim/2) tables, used in float64.
    positions: None (token t sits at position t), (T,) or (B, T) integers.
    interleaved: pairs (2i, 2i+1) as in GPT-J; otherwise (i, i + rotary_dim/2) as in
        NeoX.
    rotary_dim: rotate the first rotary_dim dims only (default all); the rest pass
        through.
    inverse: turn by -theta (the backward of the rotation).
    """
    x = x.double()
    if layout == "bhtd":
        x = x.transpose(1, 2)
    B, T, _, D = x.shape
    R = rotary_dim or D
    if positions is None:
        pos = torch.arange(T, device=x.device)
    else:
        pos = positions.to(x.device).long()
    pos = pos.expand(B, T)
    c = cos.to(x.device, torch.float64)[pos][:, :, None, :]  # (B, T, 1, R/2)
    s = sin.to(x.device, torch.float64)[pos][:, :, None, :]
    if inverse:
        s = -s
    rot, rest = x[..., :R], x[..., R:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., : R // 2], rot[..., R // 2 :]
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    if interleaved:
        y = torch.stack((y1, y2), dim=-1).flatten(-2)
    else:
        y = torch.cat((y1, y2), dim=-1)
    out = torch.cat((y, rest), dim=-1)
    return out.transpose(1, 2) if layout == "bhtd" else out


def rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
) -> torch.Tensor:
    """Plain RMSNorm over the last dim in float64, on x's device:
    x / sqrt(mean(x**2) + eps) * (weight + weight_offset). Returns float64;
    differentiable."""
    x = x.double()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * rstd * (weight.to(x.device, torch.float64) + weight_offset)


def qk_norm_rope_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    layout: str = "bthd",
    **rope_options,
) -> torch.Tensor:
    """``rope_reference(rms_norm_reference(x, weight))``: QK-norm then RoPE, in float64
    on x's device, for one of q and k.
    rope_options: positions, interleaved, rotary_dim."""
    normed = rms_norm_reference(x, weight, eps=eps, weight_offset=weight_offset)
    return rope_reference(normed, cos, sin, layout=layout, **rope_options)
