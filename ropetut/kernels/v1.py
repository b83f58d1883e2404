"""V1: the seed's first attempt, a direct port. One program per (b, t, h) row.

What it does: each program loads one row of D values, treats them as *interleaved*
pairs (x[2i], x[2i+1]) as GPT-J and RoFormer's paper do, and turns pair i by the
angle in the table.
Why it disagreed with the seed's baseline (relative error ~1.9): the baseline pairs
the two *halves* (x[i], x[i+D/2]) and uses the half-truncated spectrum; V1 was fed
the standard one.
What is slow: B*T*H tiny programs, each re-loading the cos/sin row its neighbours just
loaded, and stride-2 loads that use half of every memory transaction.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def rope_v1_kernel(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    T,
    H,
    HALF,  # HALF = D/2 pairs per row
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
    BLOCK_HALF: tl.constexpr,
):
    row = tl.program_id(0)  # row = (b * T + t) * H + h
    h = row % H
    t = (row // H) % T
    b = row // (H * T)
    i = tl.arange(0, BLOCK_HALF)  # pair index
    mask = i < HALF
    cos = tl.load(cos_ptr + t * s_cos + i, mask=mask)
    sin = tl.load(sin_ptr + t * s_cos + i, mask=mask)
    x_row = x_ptr + b * sxb + t * sxt + h * sxh
    x1 = tl.load(x_row + (2 * i) * sxd, mask=mask)  # even dims
    x2 = tl.load(x_row + (2 * i + 1) * sxd, mask=mask)  # odd dims
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    o_row = out_ptr + b * sob + t * sot + h * soh
    tl.store(o_row + (2 * i) * sod, y1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + (2 * i + 1) * sod, y2.to(out_ptr.dtype.element_ty), mask=mask)


def rope_v1(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """x, out: (B, T, H, D), any strides.
    cos, sin: (n_positions >= T, D/2), contiguous."""
    B, T, H, D = x.shape
    grid = (B * T * H,)
    rope_v1_kernel[grid](
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
        BLOCK_HALF=triton.next_power_of_2(D // 2),
    )
    return out
