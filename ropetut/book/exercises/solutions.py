"""Solutions to the exercises of chapters 3 to 5. Try them first: ``check`` says what is wrong.

Each solution keeps its starter's name and signature (``ropetut.book.exercises.ch03`` ... ``ch05``);
only the lines between the exercise markers differ. ``python -m pytest tests/test_exercises.py``
checks that every solution passes and every starter fails.
"""

import triton
import triton.language as tl

from .ch04 import rotate_heads


# -- chapter 3 ------------------------------------------------------------------------------


@triton.jit
def rope_interleaved(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_HALF: tl.constexpr,
):
    row = tl.program_id(0)
    t = row // H
    h = row % H
    i = tl.arange(0, BLOCK_HALF)
    mask = i < HALF
    cos = tl.load(cos_ptr + t * HALF + i, mask=mask)
    sin = tl.load(sin_ptr + t * HALF + i, mask=mask)
    x_row = x_ptr + t * stride_t + h * stride_h
    x1 = tl.load(x_row + 2 * i, mask=mask)
    x2 = tl.load(x_row + 2 * i + 1, mask=mask)
    # ---- exercise 3.1 ----
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    # ---- end of exercise ----
    o_row = out_ptr + t * stride_t + h * stride_h
    tl.store(o_row + 2 * i, y1, mask=mask)
    tl.store(o_row + 2 * i + 1, y2, mask=mask)


@triton.jit
def rope_any_d(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_HALF: tl.constexpr,
):
    row = tl.program_id(0)
    t = row // H
    h = row % H
    i = tl.arange(0, BLOCK_HALF)
    # ---- exercise 3.2: one mask, on every load and store ----
    mask = i < HALF
    cos = tl.load(cos_ptr + t * HALF + i, mask=mask)
    sin = tl.load(sin_ptr + t * HALF + i, mask=mask)
    x_row = x_ptr + t * stride_t + h * stride_h
    x1 = tl.load(x_row + 2 * i, mask=mask)
    x2 = tl.load(x_row + 2 * i + 1, mask=mask)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    o_row = out_ptr + t * stride_t + h * stride_h
    tl.store(o_row + 2 * i, y1, mask=mask)
    tl.store(o_row + 2 * i + 1, y2, mask=mask)
    # ---- end of exercise ----


# -- chapter 4 ------------------------------------------------------------------------------


@triton.jit
def rope_half_split(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < H) & (i < HALF)
    cos = tl.load(cos_ptr + t * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + t * HALF + i, mask=i < HALF)
    x_row = x_ptr + t * stride_t + h * stride_h
    o_row = out_ptr + t * stride_t + h * stride_h
    # ---- exercise 4.1: both loads and both stores are contiguous now ----
    x1 = tl.load(x_row + i, mask=mask)
    x2 = tl.load(x_row + i + HALF, mask=mask)
    tl.store(o_row + i, x1 * cos - x2 * sin, mask=mask)
    tl.store(o_row + i + HALF, x2 * cos + x1 * sin, mask=mask)
    # ---- end of exercise ----


@triton.jit
def rope_fused_qk(
    q_ptr,
    k_ptr,
    qo_ptr,
    ko_ptr,
    cos_ptr,
    sin_ptr,
    HQ,
    HK,
    HALF,
    sq_t,
    sq_h,
    sk_t,
    sk_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_ptr + t * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + t * HALF + i, mask=i < HALF)
    rotate_heads(q_ptr, qo_ptr, t, cos, sin, HQ, HALF, sq_t, sq_h, BLOCK_H, BLOCK_HALF)
    # ---- exercise 4.2: k's own pointers, strides and head count (HK, not HQ) ----
    rotate_heads(k_ptr, ko_ptr, t, cos, sin, HK, HALF, sk_t, sk_h, BLOCK_H, BLOCK_HALF)
    # ---- end of exercise ----


# -- chapter 5 ------------------------------------------------------------------------------


@triton.jit
def rope_fwd_bwd(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BACKWARD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_ptr + t * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + t * HALF + i, mask=i < HALF)
    # ---- exercise 5.1: cos(-theta) = cos(theta), sin(-theta) = -sin(theta) ----
    if BACKWARD:
        sin = -sin
    # ---- end of exercise ----
    rotate_heads(
        x_ptr, out_ptr, t, cos, sin, H, HALF, stride_t, stride_h, BLOCK_H, BLOCK_HALF
    )


@triton.jit
def rope_positions(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    # ---- exercise 5.2: one scalar load per program ----
    p = tl.load(pos_ptr + t)
    # ---- end of exercise ----
    cos = tl.load(cos_ptr + p * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + p * HALF + i, mask=i < HALF)
    rotate_heads(
        x_ptr, out_ptr, t, cos, sin, H, HALF, stride_t, stride_h, BLOCK_H, BLOCK_HALF
    )


@triton.jit
def rope_inplace(
    x_ptr,
    cos_ptr,
    sin_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < H) & (i < HALF)
    cos = tl.load(cos_ptr + t * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + t * HALF + i, mask=i < HALF)
    row = x_ptr + t * stride_t + h * stride_h
    # ---- exercise 5.3: load both halves once, before either store ----
    x1 = tl.load(row + i, mask=mask)
    x2 = tl.load(row + i + HALF, mask=mask)
    tl.store(row + i, x1 * cos - x2 * sin, mask=mask)
    tl.store(row + i + HALF, x2 * cos + x1 * sin, mask=mask)
    # ---- end of exercise ----
