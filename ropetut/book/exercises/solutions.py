"""Solutions to the exercises of chapters 1 to 8. Try them first: ``check`` says what
is wrong.

Each solution keeps its starter's name and signature (``ropetut.book.exercises.ch01``
... ``ch08``); only the lines between the exercise markers differ.
``python -m pytest tests/test_exercises.py`` checks that every solution passes and
every starter fails.
"""

import torch
import triton
import triton.language as tl

from .ch04 import rotate_heads

# -- chapter 1 -------------------------------------------------------------------------


def rope_from_scratch(x, base=10000.0):
    """x (T, H, D), token t at position t, turned by RoPE: half-split pairs, float64."""
    T, H, D = x.shape
    p = torch.arange(T, dtype=torch.float64, device=x.device)
    i = torch.arange(D // 2, dtype=torch.float64, device=x.device)
    x1 = x[..., : D // 2].double()
    x2 = x[..., D // 2 :].double()
    # ---- exercise 1.1: y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin ----
    omega = base ** (-2 * i / D)
    angle = p[:, None, None] * omega
    y1 = x1 * angle.cos() - x2 * angle.sin()
    y2 = x2 * angle.cos() + x1 * angle.sin()
    # ---- end of exercise ----
    return torch.cat([y1, y2], dim=-1)


# -- chapter 2 -------------------------------------------------------------------------


def rope_heads_first(x, cos, sin):
    """x (H, T, D), heads first, token t at position t; cos, sin (n_positions, D/2).
    Half-split pairs turned by +theta, in float32, as the seed's module computes."""
    # ---- exercise 2.1: T is x.size(-2); rows (T, D/2) broadcast over the heads ----
    cos = cos[: x.size(-2)]
    sin = sin[: x.size(-2)]
    # ---- end of exercise ----
    x1, x2 = x.float().chunk(2, dim=-1)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    return torch.cat((y1, y2), dim=-1).type_as(x)


# -- chapter 3 -------------------------------------------------------------------------


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


# -- chapter 4 -------------------------------------------------------------------------


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


# -- chapter 5 -------------------------------------------------------------------------


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


# -- chapter 6 -------------------------------------------------------------------------


@triton.jit
def rope_decode(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    N_POS,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    p = tl.load(pos_ptr + t)
    # ---- exercise 6.1: masked-off lanes load `other`, NaN, and NaN spreads ----
    ok = (p >= 0) & (p < N_POS) & (i < HALF)
    cos = tl.load(cos_ptr + p * HALF + i, mask=ok, other=float("nan"))
    sin = tl.load(sin_ptr + p * HALF + i, mask=ok, other=float("nan"))
    # ---- end of exercise ----
    rotate_heads(
        x_ptr, out_ptr, t, cos, sin, H, HALF, stride_t, stride_h, BLOCK_H, BLOCK_HALF
    )


# -- chapter 7 -------------------------------------------------------------------------


@triton.jit
def rope_partial(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    H,
    D,
    HALF_R,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_ptr + t * HALF_R + i, mask=i < HALF_R)
    sin = tl.load(sin_ptr + t * HALF_R + i, mask=i < HALF_R)
    rotate_heads(
        x_ptr, out_ptr, t, cos, sin, H, HALF_R, stride_t, stride_h, BLOCK_H, BLOCK_HALF
    )
    # ---- exercise 7.1: one load and one store, dims 2 HALF_R .. D-1 of every head ----
    h = tl.arange(0, BLOCK_H)[:, None]
    d = 2 * HALF_R + tl.arange(0, BLOCK_PASS)[None, :]
    mask = (h < H) & (d < D)
    x = tl.load(x_ptr + t * stride_t + h * stride_h + d, mask=mask)
    tl.store(out_ptr + t * stride_t + h * stride_h + d, x, mask=mask)
    # ---- end of exercise ----


# -- chapter 8 -------------------------------------------------------------------------


def rope_long_context(x, positions, freqs):
    """x (T, H, D) float32, token t at position positions[t] (int64, up to millions);
    freqs (D/2,) float64. Half-split pairs turned by +theta; returns float32."""
    # ---- exercise 8.1: float64 angles are exact to ~1e-10 rad at p = 2^21 ----
    angle = positions.double()[:, None] * freqs.double()[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    # ---- end of exercise ----
    cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
