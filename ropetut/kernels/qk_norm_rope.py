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

How the work is laid out: what changed from the first version (``qk_norm_rope_v1.py``,
kept for the chapter), and why. On the H100 v1's forward fell short of the copy floor
and its backward made fwd+bwd barely faster than Liger's unfused pair (issue 25 has the
figures): so many registers a thread that one program fit an SM, dw summed across warps
on every tile (barriers in the loop), k's few heads run in tiles sized for q's many,
and stores ahead of the next loads.

- A unit of work is a tile of BLOCK_T tokens x BLOCK_H heads x all pairs of one tensor:
  tokens first (prefill: 32 tokens of one head for D = 128), heads when the tokens run
  out (decode: one token, as many heads as fit). q and k have programs of their own,
  each with its own BLOCK_H, so no warp idles on k's fewer heads.
- A persistent grid: ``programs_per_sm`` programs an SM, split between q and k by
  their heads. Each walks a contiguous run of its tensor's units, heads fastest, so a
  tile's cos/sin rows are loaded once for all its heads.
- The next unit is loaded before this one is stored: two units in flight a program
  (the last unit of a run loads nothing more).
  A new tile's cos/sin rows are loaded once the old ones are used for the last time
  (after this unit is computed and stored), so one set is live: compiled for sm_90
  (Triton 3.6, bf16, D = 128, 1024 pairs a tile), 72 registers a thread forward and
  128 backward, where holding both sets took 96 and 145 (the H200 at 934e20073a).
- The backward adds each row's share of dw element-wise into fp32 registers across all
  its units, and sums them over tokens and heads once, at the end: no barrier in the
  loop. Each program writes its sum as one row of an (n_programs, D) buffer, which the
  host sums: no atomics, the same bits every run (deterministic). A register adds only
  its program's share of the rows (a few hundred of a million), then trees sum those:
  fp32 keeps its precision (tested at 2**20 rows on the GPU).

The tile sizes, warps and programs per SM are ``FORWARD`` and ``BACKWARD`` below; the
launchers take overrides as keyword arguments (``pairs_per_tile=...``), for sweeps.
Each launch's plan is kept per ``launch_key`` and a repeated launch goes straight to the
compiled kernel (``launch.py``): the host time of an eager call is mostly Triton's
binding of some 50 arguments otherwise.
"""

import struct
from functools import cache
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .final import _last_offset, _load_pairs, _store_pairs
from .launch import Plan, kept_launch, launch


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
    cos = tl.load(cos_ptr + row * s_cos + i, mask=table_mask, other=float("nan"),
                  eviction_policy="evict_last")  # kept in L2 for the next heads
    sin = tl.load(sin_ptr + row * s_cos + i, mask=table_mask, other=float("nan"),
                  eviction_policy="evict_last")  # kept in L2 for the next heads
    compute = tl.float64 if FP64 else tl.float32  # one return: the compiler types it
    return cos.to(compute), sin.to(compute)


@triton.jit
def _run_of_units(pid, n_programs, N_TILES, H, BLOCK_H: tl.constexpr):
    """The units [start, end) program pid walks: a tensor's N_TILES tiles of tokens x
    its blocks of heads, split in order into n_programs runs as even as can be."""
    n_units = N_TILES * tl.cdiv(H, BLOCK_H)
    per, extra = n_units // n_programs, n_units % n_programs
    start = pid * per + tl.minimum(pid, extra)
    return start, start + per + (pid < extra).to(tl.int32)


@triton.jit
def _unit_rows(
    u,
    N_TILES_T,
    T,
    H,
    WIDE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Unit u's batch index b, tokens t (BLOCK_T, 1, 1), heads h (1, BLOCK_H, 1) and
    their mask. Units run heads fastest, then tiles of tokens, then the batch."""
    n_head_blocks = tl.cdiv(H, BLOCK_H)
    tile = u // n_head_blocks
    b = tile // N_TILES_T
    t = (tile % N_TILES_T) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None, None]
    h = (u % n_head_blocks) * BLOCK_H + tl.arange(0, BLOCK_H)[None, :, None]
    if WIDE:  # a tensor of 2**31 elements or more: offsets in int64
        b, t, h = b.to(tl.int64), t.to(tl.int64), h.to(tl.int64)
    return b, t, h, (t < T) & (h < H)


@triton.jit
def _load_rows(
    ptr,
    sb,
    st,
    sh,
    sd,
    b,
    t,
    h,
    mask,
    i,
    HALF,
    d_pass,
    D,
    INTERLEAVED: tl.constexpr,
    HAS_PASS: tl.constexpr,
):
    """Rows (b, t, h) of a (B, T, H, D) tensor, as stored: the rotary pairs (x1, x2)
    and the pass dims xp (a zero per row without them)."""
    rows = ptr + b * sb + t * st + h * sh
    x1, x2 = _load_pairs(rows, sd, mask, i, HALF, INTERLEAVED, 0)
    if HAS_PASS:
        xp = tl.load(rows + d_pass * sd, mask=mask & (d_pass < D), other=0)
    else:
        xp = tl.zeros((x1.shape[0], x1.shape[1], 1), x1.dtype)
    return x1, x2, xp


@triton.jit
def _store_rows(
    ptr,
    sb,
    st,
    sh,
    sd,
    b,
    t,
    h,
    mask,
    i,
    HALF,
    d_pass,
    D,
    y1,
    y2,
    yp,
    INTERLEAVED: tl.constexpr,
    HAS_PASS: tl.constexpr,
):
    """Store what ``_load_rows`` loads, cast to the tensor's dtype."""
    rows = ptr + b * sb + t * st + h * sh
    out = ptr.dtype.element_ty
    _store_pairs(rows, sd, mask, i, HALF, y1.to(out), y2.to(out), INTERLEAVED)
    if HAS_PASS:
        tl.store(rows + d_pass * sd, yp.to(out), mask=mask & (d_pass < D))


@triton.jit
def _weights(w_ptr, i, HALF, d_pass, D, offset, INTERLEAVED: tl.constexpr):
    """w + weight_offset as the rows load: pairs (w1, w2) and pass dims wp, in the
    compute dtype (offset's)."""
    w1, w2 = _load_pairs(w_ptr, 1, True, i, HALF, INTERLEAVED, 0)
    wp = tl.load(w_ptr + d_pass, mask=d_pass < D, other=0)
    c = offset.dtype
    return w1.to(c) + offset, w2.to(c) + offset, wp.to(c) + offset


@triton.jit
def _rstd(x1, x2, xp, D, eps, HAS_PASS: tl.constexpr):
    """1 / sqrt(mean(x**2) + eps) over each row's D dims, (BLOCK_T, BLOCK_H, 1)."""
    squares = tl.sum(x1 * x1 + x2 * x2, axis=2, keep_dims=True)
    if HAS_PASS:
        squares += tl.sum(xp * xp, axis=2, keep_dims=True)
    return 1 / tl.sqrt(squares / D + eps)


@triton.jit
def _forward_rows(x1, x2, xp, cos, sin, w1, w2, wp, D, eps, HAS_PASS: tl.constexpr):
    """y = RoPE(x * rstd * w') for loaded rows: (y1, y2, yp), in the compute dtype."""
    x1, x2, xp = x1.to(cos.dtype), x2.to(cos.dtype), xp.to(cos.dtype)
    rstd = _rstd(x1, x2, xp, D, eps, HAS_PASS)
    n1, n2 = x1 * rstd * w1, x2 * rstd * w2
    return n1 * cos - n2 * sin, n2 * cos + n1 * sin, xp * rstd * wp


@triton.jit
def _forward_walk(
    x_ptr,
    o_ptr,
    w_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    pid,
    n_programs,
    N_TILES,
    N_TILES_T,
    T,
    H,
    HALF,
    D,
    R,
    N_POS,
    eps,
    offset,
    sxb,
    sxt,
    sxh,
    sxd,
    sob,
    sot,
    soh,
    sod,
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
    """Normalise, weight and turn program pid's run of one tensor's units."""
    i = tl.arange(0, BLOCK_HALF)[None, None, :]
    d_pass = R + tl.arange(0, BLOCK_PASS)[None, None, :]
    w1, w2, wp = _weights(w_ptr, i, HALF, d_pass, D, offset, INTERLEAVED)
    start, end = _run_of_units(pid, n_programs, N_TILES, H, BLOCK_H)
    b, t, h, mask = _unit_rows(start, N_TILES_T, T, H, WIDE, BLOCK_T, BLOCK_H)
    x1, x2, xp = _load_rows(
        x_ptr, sxb, sxt, sxh, sxd, b, t, h, mask, i, HALF, d_pass, D, INTERLEAVED,
        HAS_PASS,
    )  # fmt: skip
    cos, sin = _table(
        cos_ptr, sin_ptr, pos_ptr, b, t, i, T, HALF, N_POS, s_cos, spb, spt,
        HAS_POSITIONS, FP64,
    )  # fmt: skip
    for u in range(start, end):
        # Unit u + 1's loads before unit u's stores (past the run's end: masked off).
        nu = tl.minimum(u + 1, end - 1)
        nb, nt, nh, nmask = _unit_rows(nu, N_TILES_T, T, H, WIDE, BLOCK_T, BLOCK_H)
        nmask = nmask & (u + 1 < end)
        nx1, nx2, nxp = _load_rows(
            x_ptr, sxb, sxt, sxh, sxd, nb, nt, nh, nmask, i, HALF, d_pass, D,
            INTERLEAVED, HAS_PASS,
        )  # fmt: skip
        y1, y2, yp = _forward_rows(x1, x2, xp, cos, sin, w1, w2, wp, D, eps, HAS_PASS)
        _store_rows(
            o_ptr, sob, sot, soh, sod, b, t, h, mask, i, HALF, d_pass, D, y1, y2, yp,
            INTERLEAVED, HAS_PASS,
        )  # fmt: skip
        if nu % tl.cdiv(H, BLOCK_H) == 0:  # a new tile of tokens: its table rows
            cos, sin = _table(
                cos_ptr, sin_ptr, pos_ptr, nb, nt, i, T, HALF, N_POS, s_cos, spb, spt,
                HAS_POSITIONS, FP64,
            )  # fmt: skip
        b, t, h, mask, x1, x2, xp = nb, nt, nh, nmask, nx1, nx2, nxp


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
    N_POS,  # HALF = R/2 pairs; dims R..D pass
    eps,
    eps_lo,
    offset,
    offset_lo,  # as fp32 hi + lo
    N_TILES,
    N_TILES_T,  # tiles of tokens: in all, and per sequence
    Q_PROGRAMS,
    K_PROGRAMS,
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
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    # programs [0, Q_PROGRAMS) walk q's units, the next K_PROGRAMS k's
    pid = tl.program_id(0)
    compute = tl.float64 if FP64 else tl.float32
    eps = tl.cast(eps, compute) + eps_lo  # fp64 keeps both halves
    offset = tl.cast(offset, compute) + offset_lo
    if pid < Q_PROGRAMS:
        _forward_walk(
            q_ptr, qo_ptr, wq_ptr, cos_ptr, sin_ptr, pos_ptr, pid, Q_PROGRAMS,
            N_TILES, N_TILES_T, T, HQ, HALF, D, R, N_POS, eps, offset,
            sqb, sqt, sqh, sqd, sqob, sqot, sqoh, sqod, s_cos, spb, spt,
            HAS_POSITIONS, INTERLEAVED, HAS_PASS, FP64, WIDE,
            BLOCK_T, BLOCK_HQ, BLOCK_HALF, BLOCK_PASS,
        )  # fmt: skip
    else:
        _forward_walk(
            k_ptr, ko_ptr, wk_ptr, cos_ptr, sin_ptr, pos_ptr, pid - Q_PROGRAMS,
            K_PROGRAMS, N_TILES, N_TILES_T, T, HK, HALF, D, R, N_POS, eps, offset,
            skb, skt, skh, skd, skob, skot, skoh, skod, s_cos, spb, spt,
            HAS_POSITIONS, INTERLEAVED, HAS_PASS, FP64, WIDE,
            BLOCK_T, BLOCK_HK, BLOCK_HALF, BLOCK_PASS,
        )  # fmt: skip


@triton.jit
def _backward_rows(
    x1,
    x2,
    xp,
    dy1,
    dy2,
    dyp,
    cos,
    sin,
    w1,
    w2,
    wp,
    row_mask,
    pair_mask,
    D,
    eps,
    HAS_PASS: tl.constexpr,
):
    """For loaded rows of x and dy: dx (dx1, dx2, dxp) and the rows' shares of dw
    (g * x * rstd on the pairs and the pass dims; zero on masked rows), in the compute
    dtype."""
    c = cos.dtype
    x1, x2, xp = x1.to(c), x2.to(c), xp.to(c)
    dy1, dy2, gp = dy1.to(c), dy2.to(c), dyp.to(c)
    # g: the gradient of n, dy turned back by -theta. Lanes outside the tile read a
    # NaN table entry: zero them, or they would reach the row's mean and dw.
    g1 = tl.where(pair_mask, dy1 * cos + dy2 * sin, 0)
    g2 = tl.where(pair_mask, dy2 * cos - dy1 * sin, 0)
    rstd = _rstd(x1, x2, xp, D, eps, HAS_PASS)  # recomputed: see the header
    xh1, xh2, xhp = x1 * rstd, x2 * rstd, xp * rstd  # the normalised x
    dot = tl.sum(g1 * w1 * xh1 + g2 * w2 * xh2, axis=2, keep_dims=True)
    if HAS_PASS:
        dot += tl.sum(gp * wp * xhp, axis=2, keep_dims=True)
    mean = dot / D
    dx1 = rstd * (g1 * w1 - xh1 * mean)
    dx2 = rstd * (g2 * w2 - xh2 * mean)
    dxp = rstd * (gp * wp - xhp * mean)
    # A masked row is zeros: with an eps that rounds to 0 its rstd is inf, and its
    # share 0 * inf = NaN would reach dw.
    share1 = tl.where(pair_mask, g1 * xh1, 0)
    share2 = tl.where(pair_mask, g2 * xh2, 0)
    return dx1, dx2, dxp, share1, share2, tl.where(row_mask, gp * xhp, 0)


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
def _backward_walk(
    x_ptr,
    dy_ptr,
    dx_ptr,
    w_ptr,
    part_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    pid,
    part_row,
    n_programs,
    N_TILES,
    N_TILES_T,
    T,
    H,
    HALF,
    D,
    R,
    N_POS,
    eps,
    offset,
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
    """dx for program pid's run of one tensor's units, and their dw summed into row
    part_row of the (n_programs of q and k, D) buffer."""
    i = tl.arange(0, BLOCK_HALF)[None, None, :]
    d_pass = R + tl.arange(0, BLOCK_PASS)[None, None, :]
    w1, w2, wp = _weights(w_ptr, i, HALF, d_pass, D, offset, INTERLEAVED)
    # each lane's share of dw, summed over the tokens and heads it sees
    dw1 = tl.zeros((BLOCK_T, BLOCK_H, BLOCK_HALF), offset.dtype)
    dw2 = tl.zeros((BLOCK_T, BLOCK_H, BLOCK_HALF), offset.dtype)
    dwp = tl.zeros((BLOCK_T, BLOCK_H, BLOCK_PASS), offset.dtype)
    start, end = _run_of_units(pid, n_programs, N_TILES, H, BLOCK_H)
    b, t, h, mask = _unit_rows(start, N_TILES_T, T, H, WIDE, BLOCK_T, BLOCK_H)
    x1, x2, xp = _load_rows(
        x_ptr, sxb, sxt, sxh, sxd, b, t, h, mask, i, HALF, d_pass, D, INTERLEAVED,
        HAS_PASS,
    )  # fmt: skip
    dy1, dy2, dyp = _load_rows(
        dy_ptr, syb, syt, syh, syd, b, t, h, mask, i, HALF, d_pass, D, INTERLEAVED,
        HAS_PASS,
    )  # fmt: skip
    cos, sin = _table(
        cos_ptr, sin_ptr, pos_ptr, b, t, i, T, HALF, N_POS, s_cos, spb, spt,
        HAS_POSITIONS, FP64,
    )  # fmt: skip
    for u in range(start, end):
        # Unit u + 1's loads before unit u's stores (past the run's end: masked off).
        nu = tl.minimum(u + 1, end - 1)
        nb, nt, nh, nmask = _unit_rows(nu, N_TILES_T, T, H, WIDE, BLOCK_T, BLOCK_H)
        nmask = nmask & (u + 1 < end)
        nx1, nx2, nxp = _load_rows(
            x_ptr, sxb, sxt, sxh, sxd, nb, nt, nh, nmask, i, HALF, d_pass, D,
            INTERLEAVED, HAS_PASS,
        )  # fmt: skip
        ndy1, ndy2, ndyp = _load_rows(
            dy_ptr, syb, syt, syh, syd, nb, nt, nh, nmask, i, HALF, d_pass, D,
            INTERLEAVED, HAS_PASS,
        )  # fmt: skip
        dx1, dx2, dxp, share1, share2, sharep = _backward_rows(
            x1, x2, xp, dy1, dy2, dyp, cos, sin, w1, w2, wp, mask, mask & (i < HALF),
            D, eps, HAS_PASS,
        )  # fmt: skip
        dw1, dw2 = dw1 + share1, dw2 + share2
        if HAS_PASS:
            dwp += sharep
        _store_rows(
            dx_ptr, sdb, sdt, sdh, sdd, b, t, h, mask, i, HALF, d_pass, D,
            dx1, dx2, dxp, INTERLEAVED, HAS_PASS,
        )  # fmt: skip
        if nu % tl.cdiv(H, BLOCK_H) == 0:  # a new tile of tokens: its table rows
            cos, sin = _table(
                cos_ptr, sin_ptr, pos_ptr, nb, nt, i, T, HALF, N_POS, s_cos, spb, spt,
                HAS_POSITIONS, FP64,
            )  # fmt: skip
        b, t, h, mask, x1, x2, xp = nb, nt, nh, nmask, nx1, nx2, nxp
        dy1, dy2, dyp = ndy1, ndy2, ndyp
    # one sum over the tokens and heads, once per program
    _store_dw(
        part_ptr, part_row, D, i, HALF, d_pass, d_pass < D,
        tl.sum(tl.sum(dw1, axis=1, keep_dims=True), axis=0, keep_dims=True),
        tl.sum(tl.sum(dw2, axis=1, keep_dims=True), axis=0, keep_dims=True),
        tl.sum(tl.sum(dwp, axis=1, keep_dims=True), axis=0, keep_dims=True),
        INTERLEAVED, HAS_PASS,
    )  # fmt: skip


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
    part_ptr,
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
    N_TILES,
    N_TILES_T,
    Q_PROGRAMS,
    K_PROGRAMS,
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
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    # programs [0, Q_PROGRAMS) walk q's units, the next K_PROGRAMS k's; program pid
    # writes row pid of part_ptr's (Q_PROGRAMS + K_PROGRAMS, D) buffer (fp32; fp64 for
    # fp64), whose rows the host sums: q's first, then k's.
    pid = tl.program_id(0)
    compute = tl.float64 if FP64 else tl.float32
    eps = tl.cast(eps, compute) + eps_lo  # fp64 keeps both halves
    offset = tl.cast(offset, compute) + offset_lo
    if pid < Q_PROGRAMS:
        _backward_walk(
            q_ptr, dqo_ptr, dq_ptr, wq_ptr, part_ptr, cos_ptr, sin_ptr, pos_ptr, pid,
            pid, Q_PROGRAMS, N_TILES, N_TILES_T, T, HQ, HALF, D, R, N_POS, eps,
            offset, sqb, sqt, sqh, sqd, syqb, syqt, syqh, syqd,
            sdqb, sdqt, sdqh, sdqd, s_cos, spb, spt,
            HAS_POSITIONS, INTERLEAVED, HAS_PASS, FP64, WIDE,
            BLOCK_T, BLOCK_HQ, BLOCK_HALF, BLOCK_PASS,
        )  # fmt: skip
    else:
        _backward_walk(
            k_ptr, dko_ptr, dk_ptr, wk_ptr, part_ptr, cos_ptr, sin_ptr, pos_ptr,
            pid - Q_PROGRAMS, pid, K_PROGRAMS, N_TILES, N_TILES_T, T, HK, HALF, D, R,
            N_POS, eps, offset, skb, skt, skh, skd, sykb, sykt, sykh, sykd,
            sdkb, sdkt, sdkh, sdkd, s_cos, spb, spt,
            HAS_POSITIONS, INTERLEAVED, HAS_PASS, FP64, WIDE,
            BLOCK_T, BLOCK_HK, BLOCK_HALF, BLOCK_PASS,
        )  # fmt: skip


def _fp32_pair(x):
    """x as two fp32 scalars hi + lo. Triton passes a Python float to a compiled kernel
    as fp32; the kernels add both halves in their compute dtype, so an fp64 kernel sees
    eps and weight_offset to ~48 bits instead of 24."""
    hi = struct.unpack("f", struct.pack("f", x))[0]
    return hi, x - hi


class Tuning(NamedTuple):
    """A launch's tunables."""

    pairs_per_tile: int  # a unit's tile: BLOCK_T x BLOCK_H x BLOCK_HALF pairs
    num_warps: int
    programs_per_sm: int  # the persistent grid; CPU_SMS "SMs" under the interpreter


# 2048 pairs = 32 tokens of D = 128 over 4 warps: 32 bytes of x1 and of x2 a thread
# in bf16, two 16-byte loads each. Compiled for sm_90 (Triton 3.6, bf16, D = 128), the
# forward holds 128 registers a thread and the backward 247, so exactly 4 and 2
# programs of 4 warps fit an SM, and a persistent grid wants no more than fit. Chosen
# by scripts/probe_qk_norm.py on an H200 at a0d4c91d0f
# (results/probe_qk_norm_h200.txt): of its configs, this tile gave the fastest forward
# on every prefill shape, tied on one (91-94 % of the copy floor, graphed; the kernel
# before one set of table rows was live gave 88-90 % at 1024 pairs, 4 warps and 5
# programs, and with one set live that config fell to 83-84 %), and the fastest
# backward (fwd+bwd less fwd, by 1-3 %) at 2 programs.
FORWARD = Tuning(pairs_per_tile=2048, num_warps=4, programs_per_sm=4)
BACKWARD = Tuning(pairs_per_tile=2048, num_warps=4, programs_per_sm=2)
CPU_SMS = 1  # under the interpreter: a few programs, so each walks several units


def _tiles(T, HQ, HK, half, pairs_per_tile):
    """(BLOCK_T, BLOCK_HQ, BLOCK_HK, BLOCK_HALF): as many tokens as fit in
    pairs_per_tile pairs, then as many heads of q, and of k, as still fit."""
    block_half = triton.next_power_of_2(half)
    block_t = min(triton.next_power_of_2(T), max(1, pairs_per_tile // block_half))
    heads = max(1, pairs_per_tile // (block_t * block_half))
    return (
        block_t,
        min(triton.next_power_of_2(HQ), heads),
        min(triton.next_power_of_2(HK), heads),
        block_half,
    )


@cache
def _sm_count(device_index):
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sms(q) -> int:
    """The SMs a persistent grid fills: the GPU's, or CPU_SMS under the interpreter."""
    return _sm_count(q.get_device()) if q.is_cuda else CPU_SMS


def launch_key(
    kernel, q, k, a, b, w_q, w_k, cos, sin, positions, *, eps, interleaved,
    rotary_dim, weight_offset, tuning,
):  # fmt: skip
    """Everything a launch's plan and compiled kernel depend on but pointer alignment
    (``launch.py``): kernel (forward or backward), the shapes, strides and dtypes of q,
    k, a and b (q_out, k_out forward; dq_out, dk_out backward), the weights' dtypes
    (they are read contiguous), the tables', positions', the device, the SMs, the
    options, eps and weight_offset, and the launch's ``Tuning``: the module's
    ``FORWARD`` or ``BACKWARD`` with any overrides, read on every call, so that a
    sweep that assigns those names gets plans of its own."""
    return (
        kernel,
        q.shape,
        q.stride(),
        q.dtype,
        k.shape,
        k.stride(),
        k.dtype,
        a.stride(),
        a.dtype,
        b.stride(),
        b.dtype,
        w_q.dtype,
        w_k.dtype,
        cos.shape,
        cos.stride(),
        cos.dtype,
        sin.stride(),
        sin.dtype,
        None if positions is None else (positions.stride(), positions.dtype),
        q.get_device(),
        _sms(q),
        eps,
        weight_offset,
        interleaved,
        rotary_dim,
        tuning,
    )


def _plan(q, k, others, cos, positions, rotary_dim, interleaved, eps, offset, tuning):
    """Either kernel's launch: its grid, warps and every argument after the pointers
    (the sizes, eps and weight_offset, the tiles and programs; the strides of q, k and
    ``others``, the kernel's other (B, T, H, D) tensors: q_out, k_out forward, dq_out,
    dk_out, dq, dk backward; the table's and positions' strides; the constexprs), in
    the kernels' order. With the programs of q and of k."""
    B, T, HQ, D = q.shape
    HK, R = k.shape[2], rotary_dim
    BLOCK_T, BLOCK_HQ, BLOCK_HK, BLOCK_HALF = _tiles(
        T, HQ, HK, R // 2, tuning.pairs_per_tile
    )
    n_tiles_t = triton.cdiv(T, BLOCK_T)
    n_tiles = B * n_tiles_t
    # the grid, split by heads; a tensor gets no more programs than it has units
    programs = tuning.programs_per_sm * _sms(q)
    q_programs = round(programs * HQ / (HQ + HK))
    q_programs = min(n_tiles * triton.cdiv(HQ, BLOCK_HQ), max(1, q_programs))
    k_programs = min(n_tiles * triton.cdiv(HK, BLOCK_HK), max(1, programs - q_programs))
    scalars = (
        T,
        HQ,
        HK,
        R // 2,
        D,
        R,
        cos.shape[0],
        *_fp32_pair(eps),
        *_fp32_pair(offset),
        n_tiles,
        n_tiles_t,
        q_programs,
        k_programs,
    )
    strides = tuple(st for t in (q, k, *others) for st in t.stride())
    spb, spt = (0, 0) if positions is None else positions.stride()
    constexprs = {
        "HAS_POSITIONS": positions is not None,
        "INTERLEAVED": interleaved,
        "HAS_PASS": R < D,
        "FP64": q.dtype == torch.float64,
        "WIDE": max(_last_offset(t) for t in (q, k, *others)) >= 2**31,
        "BLOCK_T": BLOCK_T,
        "BLOCK_HQ": BLOCK_HQ,
        "BLOCK_HK": BLOCK_HK,
        "BLOCK_HALF": BLOCK_HALF,
        "BLOCK_PASS": triton.next_power_of_2(max(D - R, 1)),
    }
    return Plan(
        (q_programs + k_programs, 1, 1),
        (*scalars, *strides, cos.stride(0), spb, spt, *constexprs.values()),
        tuning.num_warps,
        (q_programs, k_programs),
    )


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
    key=None,
    **tuning,
):
    """q, q_out: (B, T, Hq, D); k, k_out: (B, T, Hkv, D); any strides; q_out may be q
    (and k_out k): in place. w_q, w_k: (D,). cos, sin: (n_positions, rotary_dim/2),
    contiguous. positions: None or (B, T) integers. key: a key that holds everything
    this launch's plan depends on, its ``Tuning`` last (``qk_norm_op``'s plain calls):
    the launch is kept under it, and no ``launch_key`` is computed; give a key or
    tuning, not both. tuning: overrides of ``FORWARD``'s fields. Returns (q_out,
    k_out)."""
    if key is not None and tuning:
        raise ValueError(f"key: holds its own Tuning, but tuning {tuning} was given")
    w_q, w_k = w_q.contiguous(), w_k.contiguous()  # the kernel reads unit strides
    if q.shape[0] * q.shape[1] == 0:
        return q_out, k_out
    kernel = qk_norm_rope_fwd_kernel
    if key is None:
        key = launch_key(
            kernel, q, k, q_out, k_out, w_q, w_k, cos, sin, positions, eps=eps,
            interleaved=interleaved, rotary_dim=rotary_dim,
            weight_offset=weight_offset,
            tuning=FORWARD._replace(**tuning) if tuning else FORWARD,
        )  # fmt: skip
    kept = kept_launch(
        kernel,
        key,
        # the key's last field is the Tuning it was computed with
        lambda: _plan(
            q, k, (q_out, k_out), cos, positions, rotary_dim, interleaved, eps,
            weight_offset, key[-1],
        ),  # fmt: skip
    )
    pos = q if positions is None else positions  # a placeholder pointer, never read
    launch(kernel, kept, (q, k, q_out, k_out, w_q, w_k, cos, sin, pos))
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
    key=None,
    **tuning,
):
    """The gradients of ``qk_norm_rope_forward`` (out of place) for output gradients
    dq_out, dk_out (any strides). q, k: the forward's inputs. key: this call's
    ``launch_key`` (``backward_key`` computes it ahead, with ``BACKWARD`` as it is
    then), or a key as the forward's: give a key or tuning, not both. tuning:
    overrides of ``BACKWARD``'s fields. Returns (dq, dk, dw_q, dw_k): dq, dk laid out
    like q and k, dw_q and dw_k in the weights' dtypes."""
    if key is not None and tuning:
        raise ValueError(f"key: holds its own Tuning, but tuning {tuning} was given")
    w_q, w_k = w_q.contiguous(), w_k.contiguous()  # the kernel reads unit strides
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    B, T, _, D = q.shape
    if B * T == 0:
        return dq, dk, torch.zeros_like(w_q), torch.zeros_like(w_k)
    kernel = qk_norm_rope_bwd_kernel
    if key is None:
        key = backward_key(
            q, k, w_q, w_k, cos, sin, dq_out, dk_out, positions=positions, eps=eps,
            interleaved=interleaved, rotary_dim=rotary_dim,
            weight_offset=weight_offset, tuning=tuning,
        )  # fmt: skip
    kept = kept_launch(
        kernel,
        key,
        # the key's last field is the Tuning it was computed with
        lambda: _plan(
            q, k, (dq_out, dk_out, dq, dk), cos, positions, rotary_dim, interleaved,
            eps, weight_offset, key[-1],
        ),  # fmt: skip
    )
    # one row of dw a program (fp32; fp64 for fp64), summed here: q's rows, then k's
    q_programs, k_programs = kept.plan.programs
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dw_part = torch.empty(q_programs + k_programs, D, dtype=acc, device=q.device)
    pos = q if positions is None else positions
    pointers = (q, k, dq_out, dk_out, dq, dk, w_q, w_k, dw_part, cos, sin, pos)
    launch(kernel, kept, pointers)
    dw_q, dw_k = dw_part[:q_programs], dw_part[q_programs:]  # (slices: less host time)
    return dq, dk, dw_q.sum(0).to(w_q.dtype), dw_k.sum(0).to(w_k.dtype)


def backward_key(
    q, k, w_q, w_k, cos, sin, dq_out, dk_out, *, positions, eps, interleaved,
    rotary_dim, weight_offset, tuning=None,
):  # fmt: skip
    """The backward's ``launch_key``. The forward can compute it ahead for gradients
    laid out like its outputs (pass q_out, k_out as dq_out, dk_out): autograd runs the
    backward on a thread where the same Python costs several times more (chapter 6).
    dq and dk, which the backward allocates like q and k, are functions of q and k."""
    return launch_key(
        qk_norm_rope_bwd_kernel, q, k, dq_out, dk_out, w_q, w_k, cos, sin, positions,
        eps=eps, interleaved=interleaved, rotary_dim=rotary_dim,
        weight_offset=weight_offset,
        tuning=BACKWARD._replace(**tuning) if tuning else BACKWARD,
    )  # fmt: skip
