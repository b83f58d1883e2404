"""final: the kernel users call through ``ropetut.apply_rope``. V4, generalised.

What it adds to V4, and why:
- positions: a (B, T) integer tensor picks each token's cos/sin row, for KV-cache decode and
  packed sequences. Without it, token t uses row t.
- interleaved pairs (x[2i], x[2i+1]) as well as half-split ones (x[i], x[i+R/2]).
- partial rotary: only the first R = rotary_dim dims turn. Out of place, the other D-R dims are
  copied; in place, they are never touched, so they cost no bytes at all.
- in place: pass the input as the output. Each element is loaded before it is stored by the
  same program, and no two programs share an element, so this is safe.
- int64 offsets: token, batch and head indices are widened before they meet a stride, so
  tensors past 2**31 elements index correctly.
- fp64 inputs compute in fp64 (gradcheck needs that); everything else computes in fp32.
"""
import torch
import triton
import triton.language as tl

from ..launch import tile_sizes


@triton.jit
def _rotate_heads(x_ptr, o_ptr, x_tok, o_tok, tok_mask, i, cos, sin, H, HALF, D, R,
                  sxh, sxd, soh, sod,
                  BLOCK_H: tl.constexpr, BLOCK_PASS: tl.constexpr,
                  INTERLEAVED: tl.constexpr, COPY_PASS: tl.constexpr):
    if INTERLEAVED:
        d1 = 2 * i
        d2 = 2 * i + 1
    else:
        d1 = i
        d2 = i + HALF
    for h0 in range(0, H, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H)[None, :, None]).to(tl.int64)
        mask = tok_mask & (h < H) & (i < HALF)
        x_row = x_ptr + x_tok + h * sxh
        o_row = o_ptr + o_tok + h * soh
        x1 = tl.load(x_row + d1 * sxd, mask=mask).to(cos.dtype)   # cos/sin already hold the compute dtype
        x2 = tl.load(x_row + d2 * sxd, mask=mask).to(cos.dtype)
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        tl.store(o_row + d1 * sod, y1.to(o_ptr.dtype.element_ty), mask=mask)
        tl.store(o_row + d2 * sod, y2.to(o_ptr.dtype.element_ty), mask=mask)
        if COPY_PASS:   # out of place with R < D: the untouched dims still need copying
            for d0 in range(R, D, BLOCK_PASS):
                d = d0 + tl.arange(0, BLOCK_PASS)[None, None, :]
                pmask = tok_mask & (h < H) & (d < D)
                tl.store(o_row + d * sod, tl.load(x_row + d * sxd, mask=pmask), mask=pmask)


@triton.jit
def rope_final_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, pos_ptr,
    T, HQ, HK, HALF, D, R,                            # HALF = R/2 pairs; dims R..D pass through
    sqb, sqt, sqh, sqd, skb, skt, skh, skd,           # q, k strides, (B, T, H, D)
    sqob, sqot, sqoh, sqod, skob, skot, skoh, skod,   # q_out, k_out strides
    s_cos, spb, spt,                                  # cos/sin row stride; positions (B, T) strides
    HAS_POSITIONS: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    COPY_PASS: tl.constexpr, FP64: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):
    b = tl.program_id(1).to(tl.int64)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
    i = tl.arange(0, BLOCK_HALF)[None, None, :]
    tok_mask = t < T
    ti_mask = tok_mask & (i < HALF)
    if HAS_POSITIONS:
        row = tl.load(pos_ptr + b * spb + t * spt, mask=tok_mask, other=0).to(tl.int64)
    else:
        row = t
    cos = tl.load(cos_ptr + row * s_cos + i, mask=ti_mask)
    sin = tl.load(sin_ptr + row * s_cos + i, mask=ti_mask)
    if FP64:
        cos, sin = cos.to(tl.float64), sin.to(tl.float64)
    else:
        cos, sin = cos.to(tl.float32), sin.to(tl.float32)
    if BACKWARD:
        sin = -sin
    _rotate_heads(q_ptr, qo_ptr, b * sqb + t * sqt, b * sqob + t * sqot, tok_mask, i, cos, sin,
                  HQ, HALF, D, R, sqh, sqd, sqoh, sqod,
                  BLOCK_H, BLOCK_PASS, INTERLEAVED, COPY_PASS)
    _rotate_heads(k_ptr, ko_ptr, b * skb + t * skt, b * skob + t * skot, tok_mask, i, cos, sin,
                  HK, HALF, D, R, skh, skd, skoh, skod,
                  BLOCK_H, BLOCK_PASS, INTERLEAVED, COPY_PASS)


def rope_final(q, k, cos, sin, q_out, k_out, *, positions=None, interleaved=False,
               rotary_dim=None, backward=False):
    """q, q_out: (B, T, Hq, D); k, k_out: (B, T, Hkv, D) or None; any strides; q_out may be q.
    cos, sin: (n_positions, rotary_dim/2), contiguous. positions: None or (B, T) integers.
    Returns (q_out, k_out)."""
    B, T, HQ, D = q.shape
    R = rotary_dim or D
    HK = 0 if k is None else k.shape[2]
    kk, kk_out = (q, q_out) if k is None else (k, k_out)   # HK = 0: the k loop never runs
    BLOCK_T, BLOCK_H, BLOCK_HALF = tile_sizes(T, max(HQ, HK), R // 2)
    pos, (spb, spt) = (positions, positions.stride()) if positions is not None else (q, (0, 0))
    grid = (triton.cdiv(T, BLOCK_T), B)
    rope_final_kernel[grid](
        q, kk, q_out, kk_out, cos, sin, pos, T, HQ, HK, R // 2, D, R,
        *q.stride(), *kk.stride(), *q_out.stride(), *kk_out.stride(), cos.stride(0), spb, spt,
        HAS_POSITIONS=positions is not None, INTERLEAVED=interleaved, BACKWARD=backward,
        COPY_PASS=R < D and q_out.data_ptr() != q.data_ptr(),
        FP64=q.dtype == torch.float64,
        BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H, BLOCK_HALF=BLOCK_HALF,
        BLOCK_PASS=triton.next_power_of_2(max(D - R, 1)),
    )
    return q_out, k_out
