"""qk_norm_rope: RMSNorm over each head of q and k, times a weight, then RoPE: one pass.

Qwen3 and Gemma 3 normalise every head of q and k over D just before RoPE. Unfused, that
is two passes over q and k forward and two backward; final's RoPE already runs at the
copy floor, so the only way to go faster is to move fewer bytes: one pass that
normalises and rotates. Per row x = q[b, t, h, :] (and k's rows, with k's own weight),
in fp32 (fp64 for fp64 inputs):

    rstd = 1 / sqrt(mean(x**2) + eps)    over all D dims
    n = x * rstd * (w + weight_offset)   weight_offset = 1: Gemma's (1 + w) convention
    y = RoPE(n)                          the first R = rotary_dim dims turn

It keeps final's options: half-split or interleaved pairs, GQA, positions (a position
outside the table loads NaN, so that token's output is NaN; nothing waits for the GPU),
partial rotary, any strides, int64 offsets past 2**31 elements. A row is loaded as its
rotary pairs (x1, x2) and its pass-through dims: the norm and the turn share one load.
Interleaved pairs, as in final, are one contiguous load of the R rotary dims, split in
registers into the even and odd dims (and joined back for one contiguous store).

In place (y written over x) is safe for the same reason as final's: each program loads a
whole row before it stores it, and no two programs share a row. It is forward only: the
backward needs x, which in place overwrites (the caller refuses it with a gradient).

The backward, with g the gradient of n (dy turned back by -theta; dy on the pass dims)
and w' = w + weight_offset:

    dw += sum over rows of g * x * rstd
    dx = rstd * (g * w' - x * rstd * mean(g * w' * x * rstd))

Stored for it: nothing but x, which autograd keeps anyway. Recomputed: rstd and
x * rstd. The backward must load x whole to form x * rstd, and rstd is one reduction
over that same row, so recomputing it reads no extra byte; storing it would add a write
to the forward, a (B, T, H) buffer and a read to the backward, to save a few flops in a
memory-bound kernel.

The weight gradients are summed without atomics, as Liger's rms_norm does: a fixed
number of programs each walk over tiles of tokens, accumulate their rows' share of dw in
fp32, and write it as one row of an (n_programs, D) buffer, which the host sums. The
result does not depend on scheduling (deterministic), and an fp32 sum over a program's
rows, then over programs, keeps the precision of a million-row reduction.
"""

import struct

import torch
import triton
import triton.language as tl

from .final import _last_offset, _load_pairs, _store_pairs
from .tiles import tile_sizes


@triton.jit
def _table(
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
    HAS_POSITIONS: tl.constexpr,
    FP64: tl.constexpr,
):
    """cos, sin for the tile's tokens, (BLOCK_T, 1, BLOCK_HALF), in the compute
    dtype."""
    tok_mask = t < T
    table_mask = tok_mask & (i < HALF)
    # a row outside the table is never read: its token gets NaN instead
    if HAS_POSITIONS:
        row = tl.load(pos_ptr + b * spb + t * spt, mask=tok_mask, other=0)
        table_mask = table_mask & (row >= 0) & (row < N_POS)
    else:
        row = t
    cos = tl.load(cos_ptr + row * s_cos + i, mask=table_mask, other=float("nan"))
    sin = tl.load(sin_ptr + row * s_cos + i, mask=table_mask, other=float("nan"))
    compute = tl.float64 if FP64 else tl.float32  # one return: the compiler types it
    return cos.to(compute), sin.to(compute)


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
def _store_dw(
    part_ptr,
    pid,
    D,
    i,
    HALF,
    d_pass,
    p_mask,
    dw1,
    dw2,
    dwp,
    INTERLEAVED: tl.constexpr,
    HAS_PASS: tl.constexpr,
):
    """This program's share of dw: row pid of the (n_programs, D) buffer (fp32; fp64 for
    fp64 inputs)."""
    row = part_ptr + pid * D
    acc = part_ptr.dtype.element_ty
    _store_pairs(row, 1, True, i, HALF, dw1.to(acc), dw2.to(acc), INTERLEAVED)
    if HAS_PASS:
        tl.store(row + d_pass, dwp.to(acc), mask=p_mask)


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


def _fp32_pair(x):
    """x as two fp32 scalars hi + lo. Triton passes a Python float to a compiled kernel
    as fp32; the kernels add both halves in their compute dtype, so an fp64 kernel sees
    eps and weight_offset to ~48 bits instead of 24."""
    hi = struct.unpack("f", struct.pack("f", x))[0]
    return hi, x - hi


PAIRS_PER_TILE, NUM_WARPS = 2048, 8  # final's tile; to be tuned on the GPU
PROGRAMS_PER_SM = (
    4  # the backward's programs: enough to fill the GPU, few dw rows to sum
)
CPU_PROGRAMS = 4  # under the interpreter: a few, so the tests walk several tiles each


def _shared_args(q, k, cos, positions, rotary_dim, interleaved):
    """What both kernels take: (T, HQ, HK, HALF, D, R, N_POS), (s_cos, spb, spt), the
    constexprs, and the number of token tiles per sequence."""
    B, T, HQ, D = q.shape
    R = rotary_dim
    BLOCK_T, BLOCK_H, BLOCK_HALF = tile_sizes(
        T, max(HQ, k.shape[2]), R // 2, PAIRS_PER_TILE
    )
    spb, spt = (0, 0) if positions is None else positions.stride()
    constexprs = dict(
        HAS_POSITIONS=positions is not None,
        INTERLEAVED=interleaved,
        HAS_PASS=R < D,
        FP64=q.dtype == torch.float64,
        WIDE=max(_last_offset(t) for t in (q, k)) >= 2**31,
        BLOCK_T=BLOCK_T,
        BLOCK_H=BLOCK_H,
        BLOCK_HALF=BLOCK_HALF,
        BLOCK_PASS=triton.next_power_of_2(max(D - R, 1)),
    )
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
