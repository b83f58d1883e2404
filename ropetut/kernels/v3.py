"""V3: the seed's finer 3-D grid, (B*H, T, ceil(D/2 / 32)), 32 pairs per program.

What changed from V2, and why it was tried: more, smaller programs should mean more
parallelism. It is correct, and slower: each program moves only 32 pairs (128 bytes per
half in fp16), so launch and scheduling overhead, index arithmetic and the cos/sin loads
(now repeated for every head) are paid per few bytes. This is over-decomposition: the
GPU already had more than enough programs in V2 to fill every SM.
"""

import torch
import triton
import triton.language as tl

PAIRS_PER_PROGRAM = 32


@triton.jit
def rope_v3_kernel(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
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
    BLOCK: tl.constexpr,
):
    bh = tl.program_id(0)  # b * H + h
    t = tl.program_id(1)
    i = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    b = bh // H
    h = bh % H
    mask = i < HALF
    cos = tl.load(cos_ptr + t * s_cos + i, mask=mask)
    sin = tl.load(sin_ptr + t * s_cos + i, mask=mask)
    x_row = x_ptr + b * sxb + t * sxt + h * sxh
    x1 = tl.load(x_row + i * sxd, mask=mask)
    x2 = tl.load(x_row + (i + HALF) * sxd, mask=mask)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    o_row = out_ptr + b * sob + t * sot + h * soh
    tl.store(o_row + i * sod, y1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + (i + HALF) * sod, y2.to(out_ptr.dtype.element_ty), mask=mask)


def rope_v3(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """x, out: (B, T, H, D), any strides.
    cos, sin: (n_positions >= T, D/2), contiguous."""
    B, T, H, D = x.shape
    grid = (B * H, T, triton.cdiv(D // 2, PAIRS_PER_PROGRAM))
    rope_v3_kernel[grid](
        x,
        out,
        cos,
        sin,
        H,
        D // 2,
        *x.stride(),
        *out.stride(),
        cos.stride(0),
        BLOCK=PAIRS_PER_PROGRAM,
    )
    return out
