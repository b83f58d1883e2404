"""Chapter 4's exercises: V2's and V4's layout, one program per token and all of its
heads.

4.1 ``rope_half_split``: pairs the two halves (i, i + D/2); as shipped it pairs
    (2i, 2i+1).
4.2 ``rope_fused_qk``: q and k in one launch, k with fewer heads (GQA); as shipped k is
    left alone.

A program loads its token's cos/sin row once and uses it for every head, of q and of
k: that is what V2 and V4 gain over V1. The starters are the chapter's exercise cells,
verbatim; the solutions are in ``ropetut.book.exercises.solutions``. Tensors are
(T, H, D), D contiguous.
"""

import triton
import triton.language as tl

from ...reference import rope_reference
from .check import exercise


@triton.jit
def rotate_heads(
    x_ptr,
    o_ptr,
    t,
    cos,
    sin,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Rotate the H heads of token t, half-split pairs, given its cos/sin row
    (1, BLOCK_HALF)."""
    h = tl.arange(0, BLOCK_H)[:, None]  # (BLOCK_H, 1)
    i = tl.arange(0, BLOCK_HALF)[None, :]  # (1, BLOCK_HALF)
    mask = (h < H) & (i < HALF)
    x_row = x_ptr + t * stride_t + h * stride_h
    x1 = tl.load(x_row + i, mask=mask)
    x2 = tl.load(x_row + i + HALF, mask=mask)
    o_row = o_ptr + t * stride_t + h * stride_h
    tl.store(o_row + i, x1 * cos - x2 * sin, mask=mask)
    tl.store(o_row + i + HALF, x2 * cos + x1 * sin, mask=mask)


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
    t = tl.program_id(0)  # one program per token, all of its heads
    h = tl.arange(0, BLOCK_H)[:, None]  # (BLOCK_H, 1)
    i = tl.arange(0, BLOCK_HALF)[None, :]  # (1, BLOCK_HALF): pair index
    mask = (h < H) & (i < HALF)
    # one row, shared by every head
    cos = tl.load(cos_ptr + t * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + t * HALF + i, mask=i < HALF)
    x_row = x_ptr + t * stride_t + h * stride_h
    o_row = out_ptr + t * stride_t + h * stride_h
    # ---- exercise 4.1: pair dim i with dim i + HALF (the two halves) ----
    x1 = tl.load(x_row + 2 * i, mask=mask)
    x2 = tl.load(x_row + 2 * i + 1, mask=mask)
    tl.store(o_row + 2 * i, x1 * cos - x2 * sin, mask=mask)
    tl.store(o_row + 2 * i + 1, x2 * cos + x1 * sin, mask=mask)
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
    t = tl.program_id(0)  # one program per token: q's heads and k's
    i = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_ptr + t * HALF + i, mask=i < HALF)  # loaded once, for q and for k
    sin = tl.load(sin_ptr + t * HALF + i, mask=i < HALF)
    rotate_heads(q_ptr, qo_ptr, t, cos, sin, HQ, HALF, sq_t, sq_h, BLOCK_H, BLOCK_HALF)
    # ---- exercise 4.2: rotate k's HK heads as well, with the same cos and sin ----
    # ---- end of exercise ----


def launch_half_split(kernel, x, cos, sin, out):
    """One program per token. x, out: (T, H, D) with one layout, D contiguous."""
    T, H, D = x.shape
    assert out.stride() == x.stride() and x.stride(2) == 1
    kernel[(T,)](
        x,
        out,
        cos,
        sin,
        H,
        D // 2,
        x.stride(0),
        x.stride(1),
        BLOCK_H=triton.next_power_of_2(H),
        BLOCK_HALF=triton.next_power_of_2(D // 2),
    )
    return out


def launch_fused_qk(kernel, q, k, cos, sin, q_out, k_out):
    """One program per token for q (T, HQ, D) and k (T, HK, D); each output shares its
    input's layout."""
    T, HQ, D = q.shape
    HK = k.shape[1]
    assert q_out.stride() == q.stride() and k_out.stride() == k.stride()
    kernel[(T,)](
        q,
        k,
        q_out,
        k_out,
        cos,
        sin,
        HQ,
        HK,
        D // 2,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        BLOCK_H=triton.next_power_of_2(max(HQ, HK)),
        BLOCK_HALF=triton.next_power_of_2(D // 2),
    )
    return q_out, k_out


@exercise("ch04.half_split", (dict(T=4, H=2, D=32), dict(T=5, H=3, D=96)))
def _run_half_split(kernel, lab, T, H, D):
    cos, sin = lab.tables(D, T + 4)
    x = lab.randn("x", T, H, D)
    out = lab.empty("out", T, H, D)
    launch_half_split(kernel, x, cos, sin, out)
    ref = lambda **kw: rope_reference(x[None], cos, sin, **kw)[0]
    lab.compare(
        "out",
        out,
        ref(),
        wrong_answers=[
            (
                (
                    "is interleaved RoPE, pairs (2i, 2i+1), as in chapter 3; this "
                    "kernel pairs (i, i + HALF)"
                ),
                ref(interleaved=True),
            ),
            ("equals the input x: nothing was rotated", x.double().cpu()),
        ],
    )


@exercise("ch04.fused_qk", (dict(T=4, HQ=2, HK=2, D=32), dict(T=5, HQ=3, HK=1, D=96)))
def _run_fused_qk(kernel, lab, T, HQ, HK, D):
    cos, sin = lab.tables(D, T + 4)
    q, k = lab.randn("q", T, HQ, D), lab.randn("k", T, HK, D)
    q_out, k_out = lab.empty("q_out", T, HQ, D), lab.empty("k_out", T, HK, D)
    launch_fused_qk(kernel, q, k, cos, sin, q_out, k_out)
    lab.compare("q_out", q_out, rope_reference(q[None], cos, sin)[0])
    lab.compare(
        "k_out",
        k_out,
        rope_reference(k[None], cos, sin)[0],
        wrong_answers=[
            ("equals k: nothing was rotated", k.double().cpu()),
        ],
    )
