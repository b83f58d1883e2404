"""qk_norm_rope_v1: the first version, kept for the chapter: why it is slow.

The fused QK-RMSNorm + RoPE as it first landed (issue 18), unchanged in behaviour; the
kernels users run are ``qk_norm_rope.py``'s. Its launchers take the same arguments as
that file's, so a benchmark can time the two side by side. What the H100 showed
(sm_90, bf16; issue 25 has the figures): the forward falls short of the copy floor, the
backward is slow (fwd+bwd barely faster than Liger's unfused pair). Why, from the
compiled kernels:

- one program walks a tile of tokens x all heads, q then k: the k phase reuses the tile
  sized for q's 32 heads on k's 8, so 6 of 8 warps idle there (forward and backward);
- the forward stores q before it loads k, so each program has one tile in flight;
- the backward holds so many registers a thread, with 256 threads, that one program
  fits an SM;
- dw is summed over the tile's tokens and heads on every tile, across warps in shared
  memory: barriers on every tile, and the next tile is loaded only after the stores.

The math, what is stored and what is recomputed are as in ``qk_norm_rope.py``; the
helpers both share (the table, the dw row, the fp32 pair) live there.
"""

import torch
import triton
import triton.language as tl

from .final import _last_offset, _load_pairs, _store_pairs
from .qk_norm_rope import _fp32_pair, _store_dw, _table
from .tiles import tile_sizes


@triton.jit
def _forward_heads(
    x_ptr,
    o_ptr,
    w_ptr,
    b,
    t,
    i,
    p,
    cos,
    sin,
    T,
    H,
    HALF,
    D,
    R,
    eps,
    eps_lo,
    offset,
    offset_lo,
    sxb,
    sxt,
    sxh,
    sxd,
    sob,
    sot,
    soh,
    sod,
    INTERLEAVED: tl.constexpr,
    HAS_PASS: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Normalise, weight and turn all H heads of the tile's tokens, BLOCK_H heads at a
    time."""
    d_pass = R + p
    p_mask = d_pass < D
    offset = tl.cast(offset, cos.dtype) + offset_lo  # fp64 keeps both halves
    eps = tl.cast(eps, cos.dtype) + eps_lo
    w1, w2 = _load_pairs(w_ptr, 1, True, i, HALF, INTERLEAVED, 0)
    w1, w2 = w1.to(cos.dtype) + offset, w2.to(cos.dtype) + offset
    wp = tl.load(w_ptr + d_pass, mask=p_mask, other=0).to(cos.dtype) + offset
    x_tok, o_tok = x_ptr + b * sxb + t * sxt, o_ptr + b * sob + t * sot
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)[None, :, None]
        if WIDE:
            h = h.to(tl.int64)
        row_mask = (t < T) & (h < H)
        x_row, o_row = x_tok + h * sxh, o_tok + h * soh
        x1, x2 = _load_pairs(x_row, sxd, row_mask, i, HALF, INTERLEAVED, 0)
        x1, x2 = x1.to(cos.dtype), x2.to(cos.dtype)
        squares = tl.sum(x1 * x1 + x2 * x2, axis=2, keep_dims=True)
        if HAS_PASS:
            xp = tl.load(x_row + d_pass * sxd, mask=row_mask & p_mask, other=0).to(
                cos.dtype
            )
            squares += tl.sum(xp * xp, axis=2, keep_dims=True)
        rstd = 1 / tl.sqrt(squares / D + eps)  # (BLOCK_T, BLOCK_H, 1)
        n1, n2 = x1 * rstd * w1, x2 * rstd * w2
        out = o_ptr.dtype.element_ty
        y1, y2 = (n1 * cos - n2 * sin).to(out), (n2 * cos + n1 * sin).to(out)
        _store_pairs(o_row, sod, row_mask, i, HALF, y1, y2, INTERLEAVED)
        if HAS_PASS:
            tl.store(
                o_row + d_pass * sod, (xp * rstd * wp).to(out), mask=row_mask & p_mask
            )


@triton.jit
def qk_norm_rope_fwd_kernel(
    q_ptr,
    k_ptr,
    qo_ptr,
    ko_ptr,
    wq_ptr,
    wk_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    T,
    HQ,
    HK,
    HALF,
    D,
    R,
    N_POS,
    eps,
    eps_lo,
    offset,
    offset_lo,  # HALF = R/2 pairs; dims R..D pass; scalars as fp32 hi + lo
    sqb,
    sqt,
    sqh,
    sqd,
    skb,
    skt,
    skh,
    skd,  # q, k strides, (B, T, H, D)
    sqob,
    sqot,
    sqoh,
    sqod,
    skob,
    skot,
    skoh,
    skod,  # q_out, k_out strides
    s_cos,
    spb,
    spt,  # cos/sin row stride; positions (B, T) strides
    HAS_POSITIONS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    HAS_PASS: tl.constexpr,
    FP64: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    b = tl.program_id(1)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
    if WIDE:  # a tensor of 2**31 elements or more: offsets in int64
        b, t = b.to(tl.int64), t.to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)[None, None, :]
    p = tl.arange(0, BLOCK_PASS)[None, None, :]
    cos, sin = _table(
        cos_ptr,
        sin_ptr,
        pos_ptr,
        b,
        t,
        i,
        T,
        HALF,
        N_POS,
        s_cos,
        spb,
        spt,
        HAS_POSITIONS,
        FP64,
    )
    _forward_heads(
        q_ptr,
        qo_ptr,
        wq_ptr,
        b,
        t,
        i,
        p,
        cos,
        sin,
        T,
        HQ,
        HALF,
        D,
        R,
        eps,
        eps_lo,
        offset,
        offset_lo,
        sqb,
        sqt,
        sqh,
        sqd,
        sqob,
        sqot,
        sqoh,
        sqod,
        INTERLEAVED,
        HAS_PASS,
        WIDE,
        BLOCK_H,
    )
    _forward_heads(
        k_ptr,
        ko_ptr,
        wk_ptr,
        b,
        t,
        i,
        p,
        cos,
        sin,
        T,
        HK,
        HALF,
        D,
        R,
        eps,
        eps_lo,
        offset,
        offset_lo,
        skb,
        skt,
        skh,
        skd,
        skob,
        skot,
        skoh,
        skod,
        INTERLEAVED,
        HAS_PASS,
        WIDE,
        BLOCK_H,
    )


@triton.jit
def _backward_heads(
    x_ptr,
    dy_ptr,
    dx_ptr,
    w_ptr,
    b,
    t,
    i,
    p,
    cos,
    sin,
    T,
    H,
    HALF,
    D,
    R,
    eps,
    eps_lo,
    offset,
    offset_lo,
    sxb,
    sxt,
    sxh,
    sxd,
    syb,
    syt,
    syh,
    syd,
    sdb,
    sdt,
    sdh,
    sdd,
    INTERLEAVED: tl.constexpr,
    HAS_PASS: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """dx for all H heads of the tile's tokens; returns their share of dw, (1, 1, BLOCK)
    each for the first and second dims of the pairs and for the pass dims, in the
    compute dtype."""
    d_pass = R + p
    i_mask, p_mask = i < HALF, d_pass < D
    offset = tl.cast(offset, cos.dtype) + offset_lo  # fp64 keeps both halves
    eps = tl.cast(eps, cos.dtype) + eps_lo
    w1, w2 = _load_pairs(w_ptr, 1, True, i, HALF, INTERLEAVED, 0)
    w1, w2 = w1.to(cos.dtype) + offset, w2.to(cos.dtype) + offset
    wp = tl.load(w_ptr + d_pass, mask=p_mask, other=0).to(cos.dtype) + offset
    dw1 = tl.zeros(w1.shape, cos.dtype)
    dw2 = tl.zeros(w2.shape, cos.dtype)
    dwp = tl.zeros(wp.shape, cos.dtype)
    x_tok, dy_tok, dx_tok = (
        x_ptr + b * sxb + t * sxt,
        dy_ptr + b * syb + t * syt,
        dx_ptr + b * sdb + t * sdt,
    )
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)[None, :, None]
        if WIDE:
            h = h.to(tl.int64)
        row_mask = (t < T) & (h < H)
        mask, pmask = row_mask & i_mask, row_mask & p_mask
        x_row, dy_row, dx_row = x_tok + h * sxh, dy_tok + h * syh, dx_tok + h * sdh
        x1, x2 = _load_pairs(x_row, sxd, row_mask, i, HALF, INTERLEAVED, 0)
        dy1, dy2 = _load_pairs(dy_row, syd, row_mask, i, HALF, INTERLEAVED, 0)
        x1, x2 = x1.to(cos.dtype), x2.to(cos.dtype)
        dy1, dy2 = dy1.to(cos.dtype), dy2.to(cos.dtype)
        # g: the gradient of n, dy turned back by -theta. Lanes outside the tile read a
        # NaN table entry: zero them, or they would reach the row's mean and dw.
        g1 = tl.where(mask, dy1 * cos + dy2 * sin, 0)
        g2 = tl.where(mask, dy2 * cos - dy1 * sin, 0)
        squares = tl.sum(x1 * x1 + x2 * x2, axis=2, keep_dims=True)
        if HAS_PASS:
            xp = tl.load(x_row + d_pass * sxd, mask=pmask, other=0).to(cos.dtype)
            gp = tl.load(dy_row + d_pass * syd, mask=pmask, other=0).to(cos.dtype)
            squares += tl.sum(xp * xp, axis=2, keep_dims=True)
        rstd = 1 / tl.sqrt(squares / D + eps)  # recomputed: see the header
        xh1, xh2 = x1 * rstd, x2 * rstd  # the normalised x
        dw1 += tl.sum(tl.sum(g1 * xh1, axis=1, keep_dims=True), axis=0, keep_dims=True)
        dw2 += tl.sum(tl.sum(g2 * xh2, axis=1, keep_dims=True), axis=0, keep_dims=True)
        dot = tl.sum(g1 * w1 * xh1 + g2 * w2 * xh2, axis=2, keep_dims=True)
        if HAS_PASS:
            xhp = xp * rstd
            dwp += tl.sum(
                tl.sum(gp * xhp, axis=1, keep_dims=True), axis=0, keep_dims=True
            )
            dot += tl.sum(gp * wp * xhp, axis=2, keep_dims=True)
        mean = dot / D
        out = dx_ptr.dtype.element_ty
        dx1 = (rstd * (g1 * w1 - xh1 * mean)).to(out)
        dx2 = (rstd * (g2 * w2 - xh2 * mean)).to(out)
        _store_pairs(dx_row, sdd, row_mask, i, HALF, dx1, dx2, INTERLEAVED)
        if HAS_PASS:
            tl.store(
                dx_row + d_pass * sdd,
                (rstd * (gp * wp - xhp * mean)).to(out),
                mask=pmask,
            )
    return dw1, dw2, dwp


@triton.jit
def qk_norm_rope_bwd_kernel(
    q_ptr,
    k_ptr,
    dqo_ptr,
    dko_ptr,
    dq_ptr,
    dk_ptr,
    wq_ptr,
    wk_ptr,
    dwq_ptr,
    dwk_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    T,
    HQ,
    HK,
    HALF,
    D,
    R,
    N_POS,
    eps,
    eps_lo,
    offset,
    offset_lo,
    N_TILES_T,
    N_TILES,
    N_PROGRAMS,
    sqb,
    sqt,
    sqh,
    sqd,
    skb,
    skt,
    skh,
    skd,  # q, k strides (the forward's inputs)
    syqb,
    syqt,
    syqh,
    syqd,
    sykb,
    sykt,
    sykh,
    sykd,  # dq_out, dk_out strides (gradients in)
    sdqb,
    sdqt,
    sdqh,
    sdqd,
    sdkb,
    sdkt,
    sdkh,
    sdkd,  # dq, dk strides (gradients out)
    s_cos,
    spb,
    spt,
    HAS_POSITIONS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    HAS_PASS: tl.constexpr,
    FP64: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    # N_PROGRAMS programs, each over tiles pid, pid + N_PROGRAMS, ... of the
    # (B, T/BLOCK_T) tiles; dwq/dwk: (N_PROGRAMS, D) fp32 (fp64 for fp64), one row per
    # program, summed by the host.
    pid = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)[None, None, :]
    p = tl.arange(0, BLOCK_PASS)[None, None, :]
    d_pass = R + p
    acc_dt = tl.float64 if FP64 else tl.float32
    dwq1 = tl.zeros((1, 1, BLOCK_HALF), acc_dt)
    dwq2 = tl.zeros((1, 1, BLOCK_HALF), acc_dt)
    dwqp = tl.zeros((1, 1, BLOCK_PASS), acc_dt)
    dwk1 = tl.zeros((1, 1, BLOCK_HALF), acc_dt)
    dwk2 = tl.zeros((1, 1, BLOCK_HALF), acc_dt)
    dwkp = tl.zeros((1, 1, BLOCK_PASS), acc_dt)
    for tile in range(pid, N_TILES, N_PROGRAMS):
        b = tile // N_TILES_T
        t = (tile % N_TILES_T) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
        if WIDE:
            b, t = b.to(tl.int64), t.to(tl.int64)
        cos, sin = _table(
            cos_ptr,
            sin_ptr,
            pos_ptr,
            b,
            t,
            i,
            T,
            HALF,
            N_POS,
            s_cos,
            spb,
            spt,
            HAS_POSITIONS,
            FP64,
        )
        a1, a2, ap = _backward_heads(
            q_ptr,
            dqo_ptr,
            dq_ptr,
            wq_ptr,
            b,
            t,
            i,
            p,
            cos,
            sin,
            T,
            HQ,
            HALF,
            D,
            R,
            eps,
            eps_lo,
            offset,
            offset_lo,
            sqb,
            sqt,
            sqh,
            sqd,
            syqb,
            syqt,
            syqh,
            syqd,
            sdqb,
            sdqt,
            sdqh,
            sdqd,
            INTERLEAVED,
            HAS_PASS,
            WIDE,
            BLOCK_H,
        )
        dwq1, dwq2, dwqp = dwq1 + a1, dwq2 + a2, dwqp + ap
        a1, a2, ap = _backward_heads(
            k_ptr,
            dko_ptr,
            dk_ptr,
            wk_ptr,
            b,
            t,
            i,
            p,
            cos,
            sin,
            T,
            HK,
            HALF,
            D,
            R,
            eps,
            eps_lo,
            offset,
            offset_lo,
            skb,
            skt,
            skh,
            skd,
            sykb,
            sykt,
            sykh,
            sykd,
            sdkb,
            sdkt,
            sdkh,
            sdkd,
            INTERLEAVED,
            HAS_PASS,
            WIDE,
            BLOCK_H,
        )
        dwk1, dwk2, dwkp = dwk1 + a1, dwk2 + a2, dwkp + ap
    p_mask = d_pass < D
    _store_dw(
        dwq_ptr,
        pid,
        D,
        i,
        HALF,
        d_pass,
        p_mask,
        dwq1,
        dwq2,
        dwqp,
        INTERLEAVED,
        HAS_PASS,
    )
    _store_dw(
        dwk_ptr,
        pid,
        D,
        i,
        HALF,
        d_pass,
        p_mask,
        dwk1,
        dwk2,
        dwkp,
        INTERLEAVED,
        HAS_PASS,
    )


PAIRS_PER_TILE, NUM_WARPS = 2048, 8  # final's tile
PROGRAMS_PER_SM = (
    4  # the backward's programs: enough to fill the GPU, few dw rows to sum
)
CPU_PROGRAMS = 4  # under the interpreter: a few, so the tests walk several tiles each


def _shared_args(q, k, cos, positions, rotary_dim, interleaved):
    """What both kernels take: (T, HQ, HK, HALF, D, R, N_POS), (s_cos, spb, spt), the
    constexprs, and the number of token tiles per sequence."""
    _, T, HQ, D = q.shape
    R = rotary_dim
    BLOCK_T, BLOCK_H, BLOCK_HALF = tile_sizes(
        T, max(HQ, k.shape[2]), R // 2, PAIRS_PER_TILE
    )
    spb, spt = (0, 0) if positions is None else positions.stride()
    constexprs = {
        "HAS_POSITIONS": positions is not None,
        "INTERLEAVED": interleaved,
        "HAS_PASS": R < D,
        "FP64": q.dtype == torch.float64,
        "WIDE": max(_last_offset(t) for t in (q, k)) >= 2**31,
        "BLOCK_T": BLOCK_T,
        "BLOCK_H": BLOCK_H,
        "BLOCK_HALF": BLOCK_HALF,
        "BLOCK_PASS": triton.next_power_of_2(max(D - R, 1)),
    }
    sizes = (T, HQ, k.shape[2], R // 2, D, R, cos.shape[0])
    return sizes, (cos.stride(0), spb, spt), constexprs, triton.cdiv(T, BLOCK_T)


def qk_norm_rope_forward(
    q,
    k,
    w_q,
    w_k,
    cos,
    sin,
    q_out,
    k_out,
    *,
    positions,
    eps,
    interleaved,
    rotary_dim,
    weight_offset,
):
    """q, q_out: (B, T, Hq, D); k, k_out: (B, T, Hkv, D); any strides; q_out may be q
    (and k_out k): in place. w_q, w_k: (D,). cos, sin: (n_positions, rotary_dim/2),
    contiguous. positions: None or (B, T) integers. Returns (q_out, k_out)."""
    w_q, w_k = w_q.contiguous(), w_k.contiguous()  # the kernel reads unit strides
    if q.shape[0] * q.shape[1] == 0:
        return q_out, k_out
    sizes, table_strides, constexprs, n_tiles_t = _shared_args(
        q, k, cos, positions, rotary_dim, interleaved
    )
    pos = q if positions is None else positions  # a placeholder pointer, never read
    constexprs["WIDE"] |= max(_last_offset(t) for t in (q_out, k_out)) >= 2**31
    qk_norm_rope_fwd_kernel[(n_tiles_t, q.shape[0])](
        q,
        k,
        q_out,
        k_out,
        w_q,
        w_k,
        cos,
        sin,
        pos,
        *sizes,
        *_fp32_pair(eps),
        *_fp32_pair(weight_offset),
        *q.stride(),
        *k.stride(),
        *q_out.stride(),
        *k_out.stride(),
        *table_strides,
        **constexprs,
        num_warps=NUM_WARPS,
    )
    return q_out, k_out


def qk_norm_rope_backward(
    q,
    k,
    w_q,
    w_k,
    cos,
    sin,
    dq_out,
    dk_out,
    *,
    positions,
    eps,
    interleaved,
    rotary_dim,
    weight_offset,
):
    """The gradients of ``qk_norm_rope_forward`` (out of place) for output gradients
    dq_out, dk_out (any strides). q, k: the forward's inputs. Returns
    (dq, dk, dw_q, dw_k): dq, dk laid out like q and k, dw_q and dw_k in the weights'
    dtypes."""
    w_q, w_k = w_q.contiguous(), w_k.contiguous()  # the kernel reads unit strides
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    B, T, _, D = q.shape
    if B * T == 0:
        return dq, dk, torch.zeros_like(w_q), torch.zeros_like(w_k)
    sizes, table_strides, constexprs, n_tiles_t = _shared_args(
        q, k, cos, positions, rotary_dim, interleaved
    )
    constexprs["WIDE"] |= max(_last_offset(t) for t in (dq_out, dk_out)) >= 2**31
    n_tiles = B * n_tiles_t
    if q.is_cuda:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        n_programs = min(n_tiles, PROGRAMS_PER_SM * sms)
    else:
        n_programs = min(n_tiles, CPU_PROGRAMS)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dwq_part = torch.empty(n_programs, D, dtype=acc, device=q.device)
    dwk_part = torch.empty(n_programs, D, dtype=acc, device=q.device)
    pos = q if positions is None else positions
    qk_norm_rope_bwd_kernel[(n_programs,)](
        q,
        k,
        dq_out,
        dk_out,
        dq,
        dk,
        w_q,
        w_k,
        dwq_part,
        dwk_part,
        cos,
        sin,
        pos,
        *sizes,
        *_fp32_pair(eps),
        *_fp32_pair(weight_offset),
        n_tiles_t,
        n_tiles,
        n_programs,
        *q.stride(),
        *k.stride(),
        *dq_out.stride(),
        *dk_out.stride(),
        *dq.stride(),
        *dk.stride(),
        *table_strides,
        **constexprs,
        num_warps=NUM_WARPS,
    )
    dw_q = dwq_part.sum(0).to(w_q.dtype)
    dw_k = dwk_part.sum(0).to(w_k.dtype)
    return dq, dk, dw_q, dw_k
