"""V2: a better grid. One program per tile of tokens x heads; half-split pairs;
any table.

What changed from V1, and why:
- A program covers BLOCK_T tokens and loops over the heads BLOCK_H at a time. All heads
  of a token share one cos/sin row, so the row is loaded once and reused for every head.
- Pairs are the two halves (x[i], x[i+D/2]), as in the seed's baseline: both loads
  are contiguous.
- The frequencies come from the table the caller passes, so the seed's half-truncated
  spectrum (its "bug") is reproduced exactly: the kernel is bug-compatible
  by construction.
Arithmetic runs in whatever dtype Triton promotes x and the table to: fp16 x with fp32
tables computes in fp32; fp16 tables compute in fp16. (V4 makes that choice explicit.)
"""

import torch
import triton
import triton.language as tl

from .tiles import tile_sizes


@triton.jit
def rope_v2_kernel(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    T,
    H,
    HALF,
    # x strides, (B, T, H, D)
    sxb,
    sxt,
    sxh,
    sxd,
    # out strides
    sob,
    sot,
    soh,
    sod,
    s_cos,  # row stride of cos/sin: (n_positions, HALF)
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    b = tl.program_id(1)
    # (BLOCK_T, 1, 1)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
    i = tl.arange(0, BLOCK_HALF)[None, None, :]  # (1, 1, BLOCK_HALF)
    ti_mask = (t < T) & (i < HALF)
    cos = tl.load(cos_ptr + t * s_cos + i, mask=ti_mask)  # once per token
    sin = tl.load(sin_ptr + t * s_cos + i, mask=ti_mask)
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)[None, :, None]  # (1, BLOCK_H, 1)
        mask = ti_mask & (h < H)
        x_row = x_ptr + b * sxb + t * sxt + h * sxh
        x1 = tl.load(x_row + i * sxd, mask=mask)
        x2 = tl.load(x_row + (i + HALF) * sxd, mask=mask)
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        o_row = out_ptr + b * sob + t * sot + h * soh
        tl.store(o_row + i * sod, y1.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(o_row + (i + HALF) * sod, y2.to(out_ptr.dtype.element_ty), mask=mask)


def rope_v2(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """x, out: (B, T, H, D), any strides.
    cos, sin: (n_positions >= T, D/2), contiguous."""
    B, T, H, D = x.shape
    BLOCK_T, BLOCK_H, BLOCK_HALF = tile_sizes(T, H, D // 2)
    grid = (triton.cdiv(T, BLOCK_T), B)
    rope_v2_kernel[grid](
        x,
        out,
        cos,
        sin,
        T,
        H,
        D // 2,
        *x.stride(),
        *out.stride(),
        cos.stride(0),
        BLOCK_T=BLOCK_T,
        BLOCK_H=BLOCK_H,
        BLOCK_HALF=BLOCK_HALF,
    )
    return out
