"""final: the kernel users call through ``ropetut.apply_rope``. V4, generalised.

What it adds to V4, and why:
- positions: a (B, T) integer tensor picks each token's cos/sin row, for KV-cache decode and
  packed sequences. Without it, token t uses row t. The kernel never reads outside the table: a
  position outside [0, n_positions) loads NaN instead of a row, so that token's output is NaN.
  Checking on the device costs nothing; checking on the host would wait for the GPU.
- interleaved pairs (x[2i], x[2i+1]) as well as half-split ones (x[i], x[i+R/2]).
- partial rotary: only the first R = rotary_dim dims turn. Out of place, the other D-R dims are
  copied; in place, they are never touched, so they cost no bytes at all.
- in place: pass the input as the output. Each element is loaded before it is stored by the
  same program, and no two programs share an element, so this is safe.
- int64 offsets: token, batch and head indices are widened before they meet a stride, so
  tensors past 2**31 elements index correctly.
- fp64 inputs compute in fp64 (gradcheck needs that); everything else computes in fp32.
- a cheap launch: Triton's launcher re-derives the kernel's specialization from every argument on
  every call, which costs more host time than a small kernel's GPU time. ``rope_final`` keeps
  the compiled kernel and its scalar arguments per set of shapes, strides, dtypes and pointer
  alignments (all that the specialization depends on), so a model's second call of a layer
  launches straight away.
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
    T, HQ, HK, HALF, D, R, N_POS,                     # HALF = R/2 pairs; dims R..D pass through
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
    if HAS_POSITIONS:   # a row outside the table is never read: its token gets NaN instead
        row = tl.load(pos_ptr + b * spb + t * spt, mask=tok_mask, other=0).to(tl.int64)
        ti_mask = ti_mask & (row >= 0) & (row < N_POS)
    else:
        row = t
    cos = tl.load(cos_ptr + row * s_cos + i, mask=ti_mask, other=float("nan"))
    sin = tl.load(sin_ptr + row * s_cos + i, mask=ti_mask, other=float("nan"))
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


# (shapes, strides, dtypes, options) -> (compiled kernel bound to its grid, scalar arguments)
_LAUNCHES = {}


def rope_final(q, k, cos, sin, q_out, k_out, *, positions=None, interleaved=False,
               rotary_dim=None, backward=False):
    """q, q_out: (B, T, Hq, D); k, k_out: (B, T, Hkv, D) or None; any strides; q_out may be q.
    cos, sin: (n_positions, rotary_dim/2), contiguous. positions: None or (B, T) integers.
    Returns (q_out, k_out)."""
    R = rotary_dim or q.shape[3]
    kk, kk_out = (q, q_out) if k is None else (k, k_out)   # HK = 0: the k loop never runs
    pos = q if positions is None else positions            # a placeholder pointer, never read
    pointers = (q, kk, q_out, kk_out, cos, sin, pos)
    # Everything Triton specializes on is a function of this key: integer arguments come from
    # shapes and strides, pointer arguments from dtypes and 16-byte alignment. Launches with a
    # misaligned pointer (rare: a view at an odd offset) go through Triton's JIT every time.
    aligned = (q.data_ptr() | kk.data_ptr() | q_out.data_ptr() | kk_out.data_ptr() | cos.data_ptr()
               | sin.data_ptr() | pos.data_ptr()) % 16 == 0
    key = (q.shape, q.stride(), q_out.stride(), q.dtype, q_out.dtype, q.device,
           None if k is None else (k.shape, k.stride(), k_out.stride(), k.dtype),
           cos.shape, cos.stride(), cos.dtype, sin.stride(), sin.dtype,
           None if positions is None else (positions.stride(), positions.dtype),
           R, interleaved, backward, q_out.data_ptr() == q.data_ptr())
    cached = _LAUNCHES.get(key) if aligned else None
    if cached is None:
        launch, grid, scalars = _first_launch(*pointers, k is not None, positions is not None, R,
                                              interleaved, backward)
        if aligned and launch is not None:   # None under the interpreter: nothing compiled to keep
            if len(_LAUNCHES) >= 4096:       # a bound on memory for callers that never repeat a shape
                _LAUNCHES.clear()
            _LAUNCHES[key] = (launch[grid], scalars)
    else:
        run, scalars = cached
        run(*pointers, *scalars)
    return q_out, k_out


def _first_launch(q, kk, q_out, kk_out, cos, sin, pos, has_k, has_positions, R, interleaved,
                  backward):
    """Launch through Triton's JIT (which compiles on first use). Returns the compiled kernel, the
    grid and every argument after the pointers, in the kernel's order, for the next launches."""
    B, T, HQ, D = q.shape
    HK = kk.shape[2] if has_k else 0
    BLOCK_T, BLOCK_H, BLOCK_HALF = tile_sizes(T, max(HQ, HK), R // 2)
    spb, spt = pos.stride() if has_positions else (0, 0)
    grid = (triton.cdiv(T, BLOCK_T), B, 1)
    scalars = (T, HQ, HK, R // 2, D, R, cos.shape[0],
               *q.stride(), *kk.stride(), *q_out.stride(), *kk_out.stride(), cos.stride(0), spb, spt)
    constexprs = dict(
        HAS_POSITIONS=has_positions, INTERLEAVED=interleaved, BACKWARD=backward,
        COPY_PASS=R < D and q_out.data_ptr() != q.data_ptr(),
        FP64=q.dtype == torch.float64,
        BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H, BLOCK_HALF=BLOCK_HALF,
        BLOCK_PASS=triton.next_power_of_2(max(D - R, 1)),
    )
    launch = rope_final_kernel[grid](q, kk, q_out, kk_out, cos, sin, pos, *scalars, **constexprs)
    return launch, grid, (*scalars, *constexprs.values())
