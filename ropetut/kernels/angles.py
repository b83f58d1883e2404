"""angles: final's rotation with no table: the kernel computes each token's angles.

What it changes from ``final``, and why:
- no cos/sin table: a table is read for every token (bytes) and held in memory (8 GiB of
  fp32 cos and sin for 2**24 positions at D = 128). The kernel reads rotary_dim/2
  frequencies instead, and int64 positions.
- the angle is exact before its last roundings. In float32, ``position * inv_freq``
  loses the angle's low bits as soon as the product is large: at position 2**24 one fp32
  ulp of the angle is 2 radians. So the kernel works in turns (angle / 2pi), where a
  whole turn is exactly 1 and reducing mod 1 is exact (``x - floor(x + 1/2)``):
  - each program multiplies its pairs' inv_freq by 1/2pi in fp64 (one product, as
    ``inv_freq.double() * (1 / (2 * math.pi))`` on the CPU, kept out of any FMA; a
    division would round once, not twice, but the division cost 13 % of the graphed
    forward's time at decode and 4 to 7 % on 8B-like prefill shapes on the H200:
    results/probe_angles_turns_h200.txt): c = inv_freq / 2pi;
  - below 2**24 (a branch per program, not per element: every prefill shape, and
    decode to 16M tokens) the position p is exact in fp32 and c is split into fp32
    c_hi + c_lo; p * c_hi is a rounded product and its exact error (an FMA), the
    product's fraction is exact, and only p * c_lo rounds (``_fraction_of_turns``);
  - beyond, c is split exactly into three fp32 words of 12 significant bits
    (``_turn_words``) and the position into three 12-bit integer parts; a product of
    a part and a word has at most 24 significant bits, so float32 holds it exactly, and
    its fraction too, whether or not a compiler contracts it into an FMA. The six
    large products are exact;
  - either way, the terms left (at most inv_freq / 2pi each) cost about 1e-8 turn; the
    fractions are summed in float-float (Knuth's TwoSum, exact) and reduced to
    [-1/2, 1/2] turn; the turn, not an angle in radians, goes to cos and sin.
  tests/test_angles.py holds the error to 1e-6 of the output's scale up to position
  2**24. Beyond, the fp64 roundings of inv_freq / 2pi (2.2e-16 relative at most: the
  constant's and the product's) grow with the position: at most
  position * inv_freq * 2.2e-16 radians, 1.5e-5 at 2**36 for inv_freq = 1. A position
  outside [0, 2**36) gets NaN, as ``final`` gives NaN for a row outside its table.
- c and its words are computed in the kernel, each program its own, not on the host
  (with heads first in the tile, a program holds one or two tokens on 8B-like shapes),
  where the host took a dozen small torch ops a call, which a CUDA graph replayed on
  every call, longer than the table kernel's whole decode step. Now a call is one
  launch and nothing else, eager or graphed, and nothing is kept between calls that
  could go stale when inv_freq is written.
- cos and sin of the reduced turn come from two short polynomials
  (``_cos_sin_of_turn``), not libdevice's sinf and cosf, whose reduction of large
  arguments is never needed here but bloats the kernel; the same arithmetic runs in
  Triton's interpreter.
- the angles are a 2-D (tokens, pairs) tensor, broadcast over the tile's heads. Where a
  program's threads outnumber its (tokens, pairs), several compute the same angle: a
  decode program of 8 warps computes each of its 64 angles four times, in parallel.
- a grid of no more programs than the GPU has SMs (decode) runs as one short wave, its
  time one program's latency. There the kernel takes a tile of up to 2,048 pairs (all
  of an 8B-like model's q heads) and 8 warps, and loads its first block of q and k
  before the angles, so that the loads are in flight during the arithmetic
  (``LOADS_FIRST``), and runs the heads' loop (``_turn_heads``) in each branch of the
  test for the short path: the angles are then computed in the tile's own layout,
  eight pairs a thread, where a branch's results went through shared memory behind
  three barriers. SMs left over take the tile's other blocks of heads
  (``HEAD_SPLIT``), blocks as small as they can take, down to half the tile
  (results/probe_angles_turn_heads_h200.txt). Elsewhere many programs share an SM and
  hide each other's arithmetic, and holding the block through it cost the forward 4 %
  at prefill (results/probe_angles_decode_h200.txt).
  An ncu profile of a decode step before these changes (results/profiles/) found q and
  k loaded only after the whole chain, which the compiler (Triton 3.6) had computed
  twice, in two layouts: 5 times the table kernel's instructions a warp, on a quarter
  of its warps a program.
- fp64 inputs (gradcheck) compute ``position * inv_freq / 2pi`` as one fp64 product
  (compiled, it is fused into the reduction's FMAs: the turn is no less exact, and may
  differ from the interpreter's in its last bits).
Everything else is ``final``'s: GQA, half-split or interleaved pairs (an interleaved
row loaded and stored whole, split into its even and odd dims in registers), partial
rotary (the pass-through dims copied out of place), in place, any strides, int64 offsets
for big tensors, backward as a turn by -theta.
"""

import math

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.language.extra import libdevice

from .final import _copy_pass_dims, _last_offset, _load_pairs, _store_pairs
from .launch import Plan, kept_launch, launch
from .tiles import tile_sizes

# as triton.jit decides: libdevice calls run only compiled
COMPILED = tl.constexpr(not knobs.runtime.interpret)
MAX_POSITION = tl.constexpr(2**36)  # positions in three 12-bit parts
SHORT_POSITIONS = tl.constexpr(2**24)  # below: the short path (``_fraction_of_turns``)
TWO_PI_HI = tl.constexpr(6.2831854820251465)  # float32(2 pi)
TWO_PI_LO = tl.constexpr(-1.7484555314695172e-07)  # float32(2 pi - TWO_PI_HI)
TURNS_PER_RADIAN = tl.constexpr(1 / (2 * math.pi))  # float64(1 / float64(2 pi))
# sin(pi/2 r) and cos(pi/2 r) for |r| <= 1/2 by their Taylor series, coefficients
# rounded to float32 (tests/test_angles.py checks them against float64 cos and sin)
SIN_C1 = tl.constexpr(1.5707963705062866)
SIN_C3 = tl.constexpr(-0.6459640860557556)
SIN_C5 = tl.constexpr(0.07969262450933456)
SIN_C7 = tl.constexpr(-0.004681753925979137)
SIN_C9 = tl.constexpr(0.00016044118092395365)
COS_C2 = tl.constexpr(-1.2337005138397217)
COS_C4 = tl.constexpr(0.25366950035095215)
COS_C6 = tl.constexpr(-0.020863480865955353)
COS_C8 = tl.constexpr(0.0009192602592520416)
COS_C10 = tl.constexpr(-2.520204179745633e-05)


@triton.jit
def _add_exactly(hi, lo, x):
    """(hi, lo) += x: TwoSum puts hi + x's rounding error into lo."""
    s = hi + x
    back = s - hi
    err = (hi - (s - back)) + (x - back)
    return s, lo + err


@triton.jit
def _fraction(x):
    """x less an integer near it, exactly (Sterbenz): in [-1/2, 1/2], or one whole turn
    below where x + 1/2 rounds up to the next integer (then down to -1), which the last
    reduction takes out. (x - floor(x) is not exact for x in (-1, 0): x + 1 needs more
    bits than x has.)"""
    return x - tl.floor(x + 0.5)


@triton.jit
def _round_to_12_bits(x):
    """fp64 x rounded to nearest with 12 significant bits (Veltkamp's split by
    2**41 + 1): x - the result is exact in fp64. x * 2**41 is exact, so the sum is
    x * (2**41 + 1) rounded once, whether the compiler contracts it into an FMA or
    not; what follows has no product to contract, since x is never a bare product
    (``_turns_per_position`` rounds c)."""
    t = x * 2199023255552.0 + x
    return t - (t - x)


@triton.jit
def _turn_words(c):
    """c = inv_freq / 2pi (fp64) as the six fp32 words ``_fraction_of_turns`` takes:
    c0, c1, c2 of 12 significant bits each (c0 + c1 + c2 is c to 36 bits), then what
    is left after one, two and three of them (c - c0, c - c0 - c1 and
    c - c0 - c1 - c2, each exact in fp64), rounded to fp32 (the last one exactly: it
    has at most 17 significant bits)."""
    c0 = _round_to_12_bits(c)
    c1_rest = c - c0
    c1 = _round_to_12_bits(c1_rest)
    c2_rest = c1_rest - c1
    c2 = _round_to_12_bits(c2_rest)
    c3_rest = c2_rest - c2
    return (
        c0.to(tl.float32), c1.to(tl.float32), c2.to(tl.float32),
        c1_rest.to(tl.float32), c2_rest.to(tl.float32), c3_rest.to(tl.float32),
    )  # fmt: skip


@triton.jit
def _turns_per_position(inv_freq):
    """inv_freq / 2pi in fp64: one product by 1/2pi rounded to fp64 (``tl.full`` makes
    the constant fp64, whatever a Triton version makes of a float literal). Compiled,
    the product is libdevice's mul_rn (PTX ``mul.rn.f64``, which is never contracted):
    a plain product was fused into the FMAs of what follows (``t - x`` in
    ``_round_to_12_bits``, ``c - c0`` in ``_turn_words``), which skip the product's
    rounding, so the words no longer summed to c (the H200 run of tests/test_angles.py).
    The interpreter's products are never contracted."""
    x = inv_freq.to(tl.float64)
    per_radian = tl.full(x.shape, TURNS_PER_RADIAN, tl.float64)
    if COMPILED:
        c = libdevice.mul_rn(x, per_radian)
    else:
        c = x * per_radian
    return c


@triton.jit
def _product_and_error(a, b):
    """fp32 a * b rounded (t) and its rounding error (a * b - t, exact): an FMA on the
    GPU (``t`` through libdevice's mul_rn, never contracted into what follows); under
    the interpreter, whose fma rounds a * b first, the error in fp64, where a * b of
    two fp32 numbers is exact. The same bits on both."""
    if COMPILED:
        t = libdevice.mul_rn(a, b)
        err = tl.fma(a, b, -t)
    else:
        t = a * b
        err = (a.to(tl.float64) * b.to(tl.float64) - t.to(tl.float64)).to(tl.float32)
    return t, err


@triton.jit
def _fraction_of_turns(c, pos):
    """position * c (c = inv_freq / 2pi, fp64) mod 1 as float-float (hi, lo), hi a few
    turns at most.

    A program whose positions are all below 2**24 (every prefill shape, and decode to
    16M tokens) takes the short path: the position is exact in fp32, c is split into
    fp32 c_hi + c_lo (to 2**-48 of c), and p * c_hi is a rounded product t plus its
    exact error (``_product_and_error``); t's fraction is exact, and only p * c_lo,
    at most c in size, rounds: about 1e-8 turn. Beyond 2**24, the long path
    (``_fraction_of_turns_long``)."""
    if tl.max(pos) < SHORT_POSITIONS:
        return _fraction_of_turns_short(c, pos)
    else:
        return _fraction_of_turns_long(c, pos)


@triton.jit
def _fraction_of_turns_short(c, pos):
    """``_fraction_of_turns`` for positions below 2**24."""
    p = pos.to(tl.float32)  # exact
    c_hi = c.to(tl.float32)
    c_lo = (c - c_hi.to(tl.float64)).to(tl.float32)  # the subtraction is exact
    t, err = _product_and_error(p, c_hi)
    hi, lo = _add_exactly(_fraction(t), tl.zeros_like(t), err)
    return _add_exactly(hi, lo, p * c_lo)


@triton.jit
def _fraction_of_turns_long(c, pos):
    """``_fraction_of_turns`` for positions to 2**36: the position in three 12-bit parts
    and c in three 12-bit words (``_turn_words``). Six products of a part and a word
    are exact, and so are their fractions; the three that are left are at most c in
    size, so rounding them costs about 1e-8 turn."""
    p0 = (pos & 4095).to(tl.float32)
    p1 = ((pos >> 12) & 4095).to(tl.float32) * 4096.0
    p2 = ((pos >> 24) & 4095).to(tl.float32) * 16777216.0
    c0, c1, c2, c1_rest, c2_rest, c3_rest = _turn_words(c)
    hi = _fraction(p2 * c0)
    lo = tl.zeros_like(hi)
    hi, lo = _add_exactly(hi, lo, _fraction(p2 * c1))
    hi, lo = _add_exactly(hi, lo, _fraction(p2 * c2))
    hi, lo = _add_exactly(hi, lo, _fraction(p1 * c0))
    hi, lo = _add_exactly(hi, lo, _fraction(p1 * c1))
    hi, lo = _add_exactly(hi, lo, _fraction(p0 * c0))
    small = p0 * c1_rest + p1 * c2_rest + p2 * c3_rest
    return _add_exactly(hi, lo, small)


@triton.jit
def _cos_sin_of_turn(turn, lo):
    """cos and sin of 2pi (turn + lo) for turn in [-1/2, 1/2] and a tiny lo: the
    quarter turn k nearest 4 turn is taken out exactly, and what is left, r in
    [-1/2, 1/2] quarter turns, goes through two short polynomials. No libdevice call
    (its sinf and cosf carry a slow reduction for large arguments, never needed here),
    and the same arithmetic runs in Triton's interpreter."""
    quarters = 4.0 * turn  # exact
    k = tl.floor(quarters + 0.5)
    r = (quarters - k) + 4.0 * lo  # quarters - k is exact
    z = r * r
    s = r * (SIN_C1 + z * (SIN_C3 + z * (SIN_C5 + z * (SIN_C7 + z * SIN_C9))))
    c = 1.0 + z * (COS_C2 + z * (COS_C4 + z * (COS_C6 + z * (COS_C8 + z * COS_C10))))
    # turning by k quarters: (cos, sin) -> (-sin, cos), k mod 4 times
    quadrant = k.to(tl.int32) & 3
    odd = (quadrant & 1) == 1
    cos = tl.where(odd, -s, c)
    sin = tl.where(odd, c, s)
    flip = quadrant >= 2
    return tl.where(flip, -cos, cos), tl.where(flip, -sin, sin)


@triton.jit
def rope_angles_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, inv_freq_ptr, pos_ptr,
    T, HQ, HK, HALF, D, R,                            # HALF = R/2; R..D pass through
    sqb, sqt, sqh, sqd, skb, skt, skh, skd,           # q, k strides, (B, T, H, D)
    sqob, sqot, sqoh, sqod, skob, skot, skoh, skod,   # q_out, k_out strides
    spb, spt, sf,                                     # positions, inv_freq strides
    HAS_POSITIONS: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    COPY_PASS: tl.constexpr, FP64: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr, HEAD_SPLIT: tl.constexpr, LOADS_FIRST: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(1)
    # HEAD_SPLIT programs share a tile's tokens, each every HEAD_SPLIT-th block of heads
    if HEAD_SPLIT > 1:
        h_first = tl.program_id(2) * BLOCK_H
    else:
        h_first = 0
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    if WIDE:  # a tensor of 2**31 elements or more: offsets in int64
        b, t = b.to(tl.int64), t.to(tl.int64)
    # (tokens, heads, pairs) rows of q and k
    t3, i3 = t[:, :, None], tl.arange(0, BLOCK_HALF)[None, None, :]
    tok_mask = t3 < T
    q_tok, qo_tok = q_ptr + b * sqb + t3 * sqt, qo_ptr + b * sqob + t3 * sqot
    k_tok, ko_tok = k_ptr + b * skb + t3 * skt, ko_ptr + b * skob + t3 * skot
    # LOADS_FIRST (a grid of one short wave, decode): the first block of heads is
    # loaded before the angles are computed, so that its loads are in flight during
    # the arithmetic, which otherwise adds to the launch's latency. Elsewhere many
    # programs share an SM and hide each other's arithmetic, and holding the block
    # through it would cost registers. HQ >= HK: a block of q heads, the same of k's.
    if LOADS_FIRST:
        h = h_first + tl.arange(0, BLOCK_H)[None, :, None]
        if WIDE:
            h = h.to(tl.int64)
        q_mask, k_mask = tok_mask & (h < HQ), tok_mask & (h < HK)
        q1, q2 = _load_pairs(q_tok + h * sqh, sqd, q_mask, i3, HALF, INTERLEAVED)
        k1, k2 = _load_pairs(k_tok + h * skh, skd, k_mask, i3, HALF, INTERLEAVED)
    else:  # nothing loaded ahead
        q1, q2, k1, k2 = None, None, None, None
    # The angles of a (tokens, pairs) tile, then broadcast over the tile's heads
    i = tl.arange(0, BLOCK_HALF)[None, :]
    if HAS_POSITIONS:
        pos = tl.load(pos_ptr + b * spb + t * spt, mask=t < T, other=0).to(tl.int64)
    else:
        pos = t.to(tl.int64)
    inv_freq = tl.load(inv_freq_ptr + i * sf, mask=i < HALF, other=0.0)
    c = _turns_per_position(inv_freq)  # (1, pairs), fp64
    valid = (pos >= 0) & (pos < MAX_POSITION) & (t < T) & (i < HALF)  # NaN outside
    if FP64:
        turns = pos.to(tl.float64) * c
        turn = turns - tl.floor(turns + 0.5)
        angle = turn * TWO_PI_HI + turn * TWO_PI_LO  # a float literal would be fp32
        cos, sin = tl.cos(angle), tl.sin(angle)
        _turn_heads(
            q_tok, qo_tok, k_tok, ko_tok, sqh, sqd, skh, skd, sqoh, sqod, skoh,
            skod, tok_mask, i3, HQ, HK, HALF, D, R, h_first, BLOCK_H * HEAD_SPLIT,
            cos, sin, valid, q1, q2, k1, k2, BLOCK_H, BLOCK_PASS, INTERLEAVED,
            BACKWARD, COPY_PASS, WIDE, LOADS_FIRST,
        )  # fmt: skip
    elif LOADS_FIRST:
        # One short wave: the heads' loop in each branch of the test for the short
        # path, so that the angles are computed in the tile's own layout. A branch's
        # results go through shared memory to reach it, three barriers on the path
        # that a launch of one short wave waits on (the sm_90 SASS).
        if tl.max(pos) < SHORT_POSITIONS:
            hi, lo = _fraction_of_turns_short(c, pos)
            cos, sin = _cos_sin_of_turn(hi - tl.floor(hi + 0.5), lo)
            _turn_heads(
                q_tok, qo_tok, k_tok, ko_tok, sqh, sqd, skh, skd, sqoh, sqod, skoh,
                skod, tok_mask, i3, HQ, HK, HALF, D, R, h_first, BLOCK_H * HEAD_SPLIT,
                cos, sin, valid, q1, q2, k1, k2, BLOCK_H, BLOCK_PASS, INTERLEAVED,
                BACKWARD, COPY_PASS, WIDE, LOADS_FIRST,
            )  # fmt: skip
        else:
            hi, lo = _fraction_of_turns_long(c, pos)
            cos, sin = _cos_sin_of_turn(hi - tl.floor(hi + 0.5), lo)
            _turn_heads(
                q_tok, qo_tok, k_tok, ko_tok, sqh, sqd, skh, skd, sqoh, sqod, skoh,
                skod, tok_mask, i3, HQ, HK, HALF, D, R, h_first, BLOCK_H * HEAD_SPLIT,
                cos, sin, valid, q1, q2, k1, k2, BLOCK_H, BLOCK_PASS, INTERLEAVED,
                BACKWARD, COPY_PASS, WIDE, LOADS_FIRST,
            )  # fmt: skip
    else:
        hi, lo = _fraction_of_turns(c, pos)
        cos, sin = _cos_sin_of_turn(hi - tl.floor(hi + 0.5), lo)
        _turn_heads(
            q_tok, qo_tok, k_tok, ko_tok, sqh, sqd, skh, skd, sqoh, sqod, skoh,
            skod, tok_mask, i3, HQ, HK, HALF, D, R, h_first, BLOCK_H * HEAD_SPLIT,
            cos, sin, valid, q1, q2, k1, k2, BLOCK_H, BLOCK_PASS, INTERLEAVED,
            BACKWARD, COPY_PASS, WIDE, LOADS_FIRST,
        )  # fmt: skip


@triton.jit
def _turn_heads(
    q_tok, qo_tok, k_tok, ko_tok, sqh, sqd, skh, skd, sqoh, sqod, skoh, skod,
    tok_mask, i3, HQ, HK, HALF, D, R, h_first, h_step, cos, sin, valid, q1, q2, k1, k2,
    BLOCK_H: tl.constexpr, BLOCK_PASS: tl.constexpr, INTERLEAVED: tl.constexpr,
    BACKWARD: tl.constexpr, COPY_PASS: tl.constexpr, WIDE: tl.constexpr,
    LOADS_FIRST: tl.constexpr,
):  # fmt: skip
    """The tile's heads, a block at a time from h_first, h_step apart: q and k turned
    by the (tokens, pairs) angles (NaN where not valid) and stored, as ``final``'s loop;
    q1, q2, k1, k2: the first block, loaded ahead (LOADS_FIRST)."""
    cos = tl.expand_dims(tl.where(valid, cos, float("nan")), 1)
    sin = tl.expand_dims(tl.where(valid, sin, float("nan")), 1)
    if BACKWARD:
        sin = -sin
    for h0 in range(h_first, HQ, h_step):
        h = h0 + tl.arange(0, BLOCK_H)[None, :, None]
        if WIDE:
            h = h.to(tl.int64)
        q_mask, k_mask = tok_mask & (h < HQ), tok_mask & (h < HK)
        q_row, qo_row = q_tok + h * sqh, qo_tok + h * sqoh
        k_row, ko_row = k_tok + h * skh, ko_tok + h * skoh
        if LOADS_FIRST:
            if h0 > h_first:  # the first block was loaded ahead
                q1, q2 = _load_pairs(q_row, sqd, q_mask, i3, HALF, INTERLEAVED)
                k1, k2 = _load_pairs(k_row, skd, k_mask, i3, HALF, INTERLEAVED)
            qc1, qc2 = q1.to(cos.dtype), q2.to(cos.dtype)
            kc1, kc2 = k1.to(cos.dtype), k2.to(cos.dtype)
        else:
            x1, x2 = _load_pairs(q_row, sqd, q_mask, i3, HALF, INTERLEAVED)
            y1, y2 = _load_pairs(k_row, skd, k_mask, i3, HALF, INTERLEAVED)
            qc1, qc2 = x1.to(cos.dtype), x2.to(cos.dtype)
            kc1, kc2 = y1.to(cos.dtype), y2.to(cos.dtype)
        # (the output dtypes inline: a tuple of dtypes assigned in the loop does not
        # compile for sm_90, though the interpreter takes it)
        q_out1 = (qc1 * cos - qc2 * sin).to(qo_tok.dtype.element_ty)
        q_out2 = (qc2 * cos + qc1 * sin).to(qo_tok.dtype.element_ty)
        k_out1 = (kc1 * cos - kc2 * sin).to(ko_tok.dtype.element_ty)
        k_out2 = (kc2 * cos + kc1 * sin).to(ko_tok.dtype.element_ty)
        _store_pairs(qo_row, sqod, q_mask, i3, HALF, q_out1, q_out2, INTERLEAVED)
        _store_pairs(ko_row, skod, k_mask, i3, HALF, k_out1, k_out2, INTERLEAVED)
        if COPY_PASS:
            _copy_pass_dims(q_row, qo_row, q_mask, R, D, sqd, sqod, BLOCK_PASS)
            _copy_pass_dims(k_row, ko_row, k_mask, R, D, skd, skod, BLOCK_PASS)


# Tiles as final's (``tile_sizes``: heads first, then tokens), of 1024 pairs and 2
# warps, chosen from a sweep of tiles and warps on the H100 (issue 26's note);
# ``python -m ropetut bench-angles`` compares this kernel with the table's.
PAIRS_PER_TILE, NUM_WARPS = 1024, 2
# A grid of no more programs than the GPU has SMs (decode: 64 sequences of one token)
# runs as one short wave, whose time is about one program's latency: there, the same
# tokens a program but heads up to 2048 pairs (all 32 heads of an 8B-like model's q at
# decode), 8 warps, and LOADS_FIRST (results/probe_angles_decode_h200.txt); where SMs
# are left over, a tile's blocks of heads are split between that many programs of the
# same tokens (HEAD_SPLIT: at 64 heads' decode 0.87x the table's forward against 1.08x
# unsplit; results/probe_angles_head_split_h200.txt), in blocks as small as the spare
# SMs take, down to half the tile (32 heads' decode: two programs of 16 heads, not one
# of 32; results/probe_angles_turn_heads_h200.txt). CPU_SMS: the SMs the interpreter
# counts.
SHORT_WAVE_PAIRS_PER_TILE, SHORT_WAVE_NUM_WARPS = 2048, 8
CPU_SMS = 1


def rope_angles(
    q, k, inv_freq, q_out, k_out, *, positions=None, interleaved=False,
    rotary_dim=None, backward=False, key=None,
):  # fmt: skip
    """q, q_out: (B, T, Hq, D); k, k_out: (B, T, Hkv, D) or None; any strides; q_out may
    be q. inv_freq: (rotary_dim/2,) float32 or float64, any stride, handed to the kernel
    as it is (the kernel computes its words). positions: None or (B, T) integers. key:
    ``launch_key`` of these arguments, when the caller computed it ahead (the
    backward's, in ``AnglesFunction``'s forward). Returns (q_out, k_out). A repeated
    launch goes straight to the compiled kernel, as ``final``'s does (``launch``)."""
    R = rotary_dim or q.shape[3]
    # HK = 0: the k loop never runs
    kk, kk_out = (q, q_out) if k is None else (k, k_out)
    pos = q if positions is None else positions  # a placeholder pointer, never read
    pointers = (q, kk, q_out, kk_out, inv_freq, pos)
    if key is None:
        key = launch_key(
            q, k, inv_freq, q_out, k_out, positions, R, interleaved, backward,
            in_place=q_out.data_ptr() == q.data_ptr(),
        )  # fmt: skip
    kept = kept_launch(  # the tiles the key names: a key computed ahead keeps its own
        rope_angles_kernel,
        key,
        lambda: _plan(
            *pointers, k is not None, positions is not None, R, interleaved, backward,
            key[-4:],
        ),
    )  # fmt: skip
    launch(rope_angles_kernel, kept, pointers)
    return q_out, k_out


def launch_key(
    q, k, inv_freq, q_out, k_out, positions, R, interleaved, backward, *, in_place,
):  # fmt: skip
    """Everything a launch's plan is computed from (``launch.kept_launch``), the tile
    and warps too: read at every call, so that a sweep that assigns them gets plans of
    its own. A key computed ahead (the backward's, in the forward) keeps the tiles of its
    time: ``rope_angles`` plans with the tiles its key names (its last four entries)."""
    return (
        q.shape, q.stride(), q_out.stride(), q.dtype, q_out.dtype, q.get_device(),
        None if k is None
        else (k.shape, k.stride(), k_out.stride(), k.dtype, k_out.dtype),
        inv_freq.dtype, inv_freq.stride(),
        None if positions is None else (positions.stride(), positions.dtype),
        R, interleaved, backward, in_place, PAIRS_PER_TILE, NUM_WARPS,
        SHORT_WAVE_PAIRS_PER_TILE, SHORT_WAVE_NUM_WARPS,
    )  # fmt: skip


def _sms(q) -> int:
    """The SMs of q's GPU, or CPU_SMS under the interpreter."""
    if q.is_cuda:
        return torch.cuda.get_device_properties(q.device).multi_processor_count
    return CPU_SMS


def _plan(
    q, kk, q_out, kk_out, inv_freq, pos, has_k, has_positions, R, interleaved,
    backward, tiles=None,
):  # fmt: skip
    """The launch's grid and every argument after the pointers, the constexprs too, in
    the kernel's order. tiles: (PAIRS_PER_TILE, NUM_WARPS, SHORT_WAVE_PAIRS_PER_TILE,
    SHORT_WAVE_NUM_WARPS), as the launch key holds them; None: the module's now."""
    pairs_per_tile, warps, short_pairs, short_warps = tiles or (
        PAIRS_PER_TILE, NUM_WARPS, SHORT_WAVE_PAIRS_PER_TILE, SHORT_WAVE_NUM_WARPS,
    )  # fmt: skip
    B, T, HQ, D = q.shape
    HK = kk.shape[2] if has_k else 0
    BLOCK_T, BLOCK_H, BLOCK_HALF = tile_sizes(T, HQ, R // 2, pairs_per_tile)
    num_warps, head_split = warps, 1
    programs = B * triton.cdiv(T, BLOCK_T)
    one_short_wave = programs <= _sms(q)
    if one_short_wave:  # the same tokens a program: more heads, more warps
        spare = max(1, _sms(q) // max(programs, 1))  # SMs for each tile's tokens
        most = max(1, short_pairs // (BLOCK_T * BLOCK_HALF))  # heads: the short tile
        # blocks of heads as small as the spare SMs can take, down to half the tile
        wanted = triton.next_power_of_2(triton.cdiv(HQ, spare))
        BLOCK_H = min(triton.next_power_of_2(HQ), most, max(wanted, most // 2))
        num_warps = short_warps
        # the SMs left over take the tile's other blocks of heads
        head_split = min(triton.cdiv(HQ, BLOCK_H), spare)
    spb, spt = pos.stride() if has_positions else (0, 0)
    scalars = (
        T, HQ, HK, R // 2, D, R, *q.stride(), *kk.stride(), *q_out.stride(),
        *kk_out.stride(), spb, spt, inv_freq.stride(0),
    )  # fmt: skip
    constexprs = {
        "HAS_POSITIONS": has_positions, "INTERLEAVED": interleaved,
        "BACKWARD": backward, "COPY_PASS": R < D and q_out.data_ptr() != q.data_ptr(),
        "FP64": q.dtype == torch.float64,
        "WIDE": max(_last_offset(t) for t in (q, kk, q_out, kk_out)) >= 2**31,
        "BLOCK_T": BLOCK_T, "BLOCK_H": BLOCK_H, "BLOCK_HALF": BLOCK_HALF,
        "BLOCK_PASS": triton.next_power_of_2(max(D - R, 1)),
        "HEAD_SPLIT": head_split, "LOADS_FIRST": one_short_wave,
    }  # fmt: skip
    grid = (triton.cdiv(T, BLOCK_T), B, head_split)
    return Plan(grid, (*scalars, *constexprs.values()), num_warps)
