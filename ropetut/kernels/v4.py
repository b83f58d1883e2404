"""V4: V2 with explicit fp32 arithmetic, Q and K fused in one launch (with GQA),
and a backward.

What changed from V2, and why:
- Every load is widened to fp32 before the math and narrowed once at the store, whatever
  the dtypes of x and of the table. (V2 with fp32 tables already computed in fp32,
  through Triton's type promotion; with fp16 tables it did not. V4 no longer depends on
  the caller's table.)
- One launch rotates q and k. A program loads its tokens' cos/sin once and uses them
  for all Hq query heads and all Hkv key heads. GQA (Hq a multiple of Hkv) costs nothing
  extra: k simply has fewer heads to loop over.
- BACKWARD turns by -theta. A rotation is orthogonal, so its backward (the transpose) is
  the rotation by the opposite angle: dL/dx = R(-theta) dL/dy. Same kernel, sin negated.
"""

import triton
import triton.language as tl

from .tiles import tile_sizes


@triton.jit
def _rotate_heads(
    x_tok, o_tok, i, mask, cos, sin, H, HALF, sxh, sxd, soh, sod, BLOCK_H: tl.constexpr
):
    """Rotate all H heads of the tile's tokens, BLOCK_H heads at a time, in fp32.
    x_tok, o_tok: the tokens' rows in x and in the output, at head 0; mask: the tile's
    (token, pair) mask."""
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)[None, :, None]
        h_mask = mask & (h < H)
        x_row = x_tok + h * sxh
        x1 = tl.load(x_row + i * sxd, mask=h_mask).to(tl.float32)
        x2 = tl.load(x_row + (i + HALF) * sxd, mask=h_mask).to(tl.float32)
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        o_row = o_tok + h * soh
        tl.store(o_row + i * sod, y1.to(o_tok.dtype.element_ty), mask=h_mask)
        tl.store(o_row + (i + HALF) * sod, y2.to(o_tok.dtype.element_ty), mask=h_mask)


@triton.jit
def rope_v4_kernel(
    q_ptr,
    k_ptr,
    qo_ptr,
    ko_ptr,
    cos_ptr,
    sin_ptr,
    T,
    HQ,
    HK,
    HALF,
    # q, k strides, (B, T, H, D)
    sqb,
    sqt,
    sqh,
    sqd,
    skb,
    skt,
    skh,
    skd,
    # q_out, k_out strides
    sqob,
    sqot,
    sqoh,
    sqod,
    skob,
    skot,
    skoh,
    skod,
    s_cos,  # row stride of cos/sin: (n_positions, HALF)
    BACKWARD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    b = tl.program_id(1)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
    i = tl.arange(0, BLOCK_HALF)[None, None, :]
    ti_mask = (t < T) & (i < HALF)
    cos = tl.load(cos_ptr + t * s_cos + i, mask=ti_mask).to(tl.float32)
    sin = tl.load(sin_ptr + t * s_cos + i, mask=ti_mask).to(tl.float32)
    if BACKWARD:
        sin = -sin
    q_tok, qo_tok = q_ptr + b * sqb + t * sqt, qo_ptr + b * sqob + t * sqot
    k_tok, ko_tok = k_ptr + b * skb + t * skt, ko_ptr + b * skob + t * skot
    _rotate_heads(
        q_tok, qo_tok, i, ti_mask, cos, sin, HQ, HALF, sqh, sqd, sqoh, sqod, BLOCK_H
    )
    _rotate_heads(
        k_tok, ko_tok, i, ti_mask, cos, sin, HK, HALF, skh, skd, skoh, skod, BLOCK_H
    )


def rope_v4(q, k, cos, sin, q_out, k_out, *, backward: bool = False):
    """q, q_out: (B, T, Hq, D); k, k_out: (B, T, Hkv, D) or None; any strides.
    cos, sin: (n_positions >= T, D/2), contiguous. Returns (q_out, k_out)."""
    B, T, HQ, D = q.shape
    HK = 0 if k is None else k.shape[2]
    # HK = 0: the k loop never runs
    kk, kk_out = (q, q_out) if k is None else (k, k_out)
    HALF = D // 2
    BLOCK_T, BLOCK_H, BLOCK_HALF = tile_sizes(T, max(HQ, HK), HALF)
    grid = (triton.cdiv(T, BLOCK_T), B)
    pointers = (q, kk, q_out, kk_out, cos, sin)
    strides = (*q.stride(), *kk.stride(), *q_out.stride(), *kk_out.stride())
    tile = {"BLOCK_T": BLOCK_T, "BLOCK_H": BLOCK_H, "BLOCK_HALF": BLOCK_HALF}
    rope_v4_kernel[grid](
        *pointers, T, HQ, HK, HALF, *strides, cos.stride(0), BACKWARD=backward, **tile
    )
    return q_out, k_out
