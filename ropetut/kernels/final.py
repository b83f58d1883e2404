"""final: the kernel users call through ``ropetut.apply_rope``. V4, generalised.

What it adds to V4, and why:
- positions: a (B, T) integer tensor picks each token's cos/sin row, for KV-cache decode
  and packed sequences. Without it, token t uses row t. The kernel never reads outside
  the table: a position outside [0, n_positions) loads NaN instead of a row, so that
  token's output is NaN. Checking on the device costs nothing; checking on the host
  would wait for the GPU.
- interleaved pairs (x[2i], x[2i+1]) as well as half-split ones (x[i], x[i+R/2]). Both
  move whole rows: an interleaved row's R rotary dims are one contiguous load, split in
  registers into its even and odd dims, and one contiguous store of the two joined back.
  Loads and stores of stride 2 would not vectorise: one instruction per element, not per
  16 bytes.
- partial rotary: only the first R = rotary_dim dims turn. Out of place, the other D-R
  dims are copied; in place, they are never touched, so they cost no bytes at all.
- in place: pass the input as the output. Each element is loaded before it is stored by
  the same program, and no two programs share an element, so this is safe.
- int64 offsets where they are needed: for a tensor of 2**31 elements or more, token,
  batch and head indices are widened before they meet a stride; smaller tensors keep
  int32 arithmetic.
- fp64 inputs compute in fp64 (gradcheck needs that); everything else computes in fp32.
- a cheap launch: Triton's launcher re-derives the kernel's specialization from every
  argument on every call, which costs more host time than a small kernel's GPU time.
  ``rope_final`` keeps the compiled kernel and its scalar arguments per set of shapes,
  strides, dtypes and pointer alignments (all that the specialization depends on), so a
  model's second call of a layer launches straight away: it hands the arguments and the
  current stream to the compiled kernel's launcher, skipping the Python wrapper Triton
  puts around it (which looks up the device, the stream and Triton's launch hooks on
  every call). Those hooks, used by profilers such as Proton, are therefore not called
  for cached launches. That launcher is Triton's private interface:
  ``direct_launch_matches`` checks that the installed Triton calls it as this file does,
  and where it does not, every launch goes through ``kernel[grid](...)``.
"""

import inspect
from functools import cache

import torch
import triton
import triton.language as tl

from .tiles import tile_sizes


@triton.jit
def _copy_pass_dims(x_row, o_row, mask, R, D, sxd, sod, BLOCK_PASS: tl.constexpr):
    """Out of place with R < D: the dims that do not turn still need copying to
    the output."""
    for d0 in range(R, D, BLOCK_PASS):
        d = d0 + tl.arange(0, BLOCK_PASS)[None, None, :]
        tl.store(
            o_row + d * sod,
            tl.load(x_row + d * sxd, mask=mask & (d < D)),
            mask=mask & (d < D),
        )


@triton.jit
def _load_pairs(row, stride, row_mask, i, HALF, INTERLEAVED: tl.constexpr, other=None):
    """A row's rotary pairs (x1, x2), shaped like i (pairs, (1, 1, BLOCK_HALF))
    broadcast with row_mask (rows). Interleaved: one contiguous load of the row's
    R = 2 * HALF dims, split in registers into its even dims (x1) and its odd
    dims (x2)."""
    if INTERLEAVED:
        j = tl.arange(0, 2 * i.shape[2])[None, None, :]
        x = tl.load(row + j * stride, mask=row_mask & (j < 2 * HALF), other=other)
        x1, x2 = tl.split(tl.reshape(x, (x.shape[0], x.shape[1], i.shape[2], 2)))
    else:
        x1 = tl.load(row + i * stride, mask=row_mask & (i < HALF), other=other)
        x2 = tl.load(row + (i + HALF) * stride, mask=row_mask & (i < HALF), other=other)
    return x1, x2


@triton.jit
def _store_pairs(row, stride, row_mask, i, HALF, x1, x2, INTERLEAVED: tl.constexpr):
    """Store the pairs ``_load_pairs`` loads. Interleaved: x1 and x2 joined back into
    one contiguous store of the row's R dims."""
    if INTERLEAVED:
        j = tl.arange(0, 2 * i.shape[2])[None, None, :]
        x = tl.interleave(x1, x2)
        tl.store(row + j * stride, x, mask=row_mask & (j < 2 * HALF))
    else:
        tl.store(row + i * stride, x1, mask=row_mask & (i < HALF))
        tl.store(row + (i + HALF) * stride, x2, mask=row_mask & (i < HALF))


@triton.jit
def rope_final_kernel(
    q_ptr,
    k_ptr,
    qo_ptr,
    ko_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    # HALF = R/2 pairs; dims R..D pass through
    T,
    HQ,
    HK,
    HALF,
    D,
    R,
    N_POS,
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
    # cos/sin row stride; positions (B, T) strides
    s_cos,
    spb,
    spt,
    HAS_POSITIONS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BACKWARD: tl.constexpr,
    COPY_PASS: tl.constexpr,
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
    if FP64:
        cos, sin = cos.to(tl.float64), sin.to(tl.float64)
    else:
        cos, sin = cos.to(tl.float32), sin.to(tl.float32)
    if BACKWARD:
        sin = -sin
    q_tok, qo_tok = q_ptr + b * sqb + t * sqt, qo_ptr + b * sqob + t * sqot
    k_tok, ko_tok = k_ptr + b * skb + t * skt, ko_ptr + b * skob + t * skot
    # HQ >= HK: a block of q heads and the same block of k heads
    for h0 in range(0, HQ, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)[None, :, None]
        if WIDE:
            h = h.to(tl.int64)
        q_mask, k_mask = tok_mask & (h < HQ), tok_mask & (h < HK)
        q_row, qo_row = q_tok + h * sqh, qo_tok + h * sqoh
        k_row, ko_row = k_tok + h * skh, ko_tok + h * skoh
        # Every load before the first store: four tiles in flight, not two.
        q1, q2 = _load_pairs(q_row, sqd, q_mask, i, HALF, INTERLEAVED)
        k1, k2 = _load_pairs(k_row, skd, k_mask, i, HALF, INTERLEAVED)
        q1, q2 = q1.to(cos.dtype), q2.to(cos.dtype)
        k1, k2 = k1.to(cos.dtype), k2.to(cos.dtype)
        qo1 = (q1 * cos - q2 * sin).to(qo_ptr.dtype.element_ty)
        qo2 = (q2 * cos + q1 * sin).to(qo_ptr.dtype.element_ty)
        _store_pairs(qo_row, sqod, q_mask, i, HALF, qo1, qo2, INTERLEAVED)
        ko1 = (k1 * cos - k2 * sin).to(ko_ptr.dtype.element_ty)
        ko2 = (k2 * cos + k1 * sin).to(ko_ptr.dtype.element_ty)
        _store_pairs(ko_row, skod, k_mask, i, HALF, ko1, ko2, INTERLEAVED)
        if COPY_PASS:
            _copy_pass_dims(q_row, qo_row, q_mask, R, D, sqd, sqod, BLOCK_PASS)
            _copy_pass_dims(k_row, ko_row, k_mask, R, D, skd, skod, BLOCK_PASS)


# 2048 pairs and 8 warps a program: the best or level with the best on the H100, for
# every benchmark shape (tiles of 1024 to 4096 pairs, 4 or 8 warps, timed against Liger
# from CUDA graphs).
PAIRS_PER_TILE, NUM_WARPS = 2048, 8
# (shapes, strides, dtypes, options)
#   -> (compiled kernel, grid, device index, scalar arguments)
_LAUNCHES = {}


def rope_final(
    q,
    k,
    cos,
    sin,
    q_out,
    k_out,
    *,
    positions=None,
    interleaved=False,
    rotary_dim=None,
    backward=False,
    key=None,
):
    """q, q_out: (B, T, Hq, D); k, k_out: (B, T, Hkv, D) or None; any strides; q_out
    may be q. cos, sin: (n_positions, rotary_dim/2), contiguous. positions: None or
    (B, T) integers. key: ``launch_key`` of these arguments, when the caller computed it
    ahead (the backward's, from ``prepare_backward``). Returns (q_out, k_out)."""
    R = rotary_dim or q.shape[3]
    # HK = 0: the k loop never runs
    kk, kk_out = (q, q_out) if k is None else (k, k_out)
    pos = q if positions is None else positions  # a placeholder pointer, never read
    pointers = (q, kk, q_out, kk_out, cos, sin, pos)
    # Everything Triton specializes on is a function of this key: integer arguments come
    # from shapes and strides, pointer arguments from dtypes and 16-byte alignment.
    # Launches with a misaligned pointer (rare: a view at an odd offset) go through
    # Triton's JIT every time.
    q_ptr, q_out_ptr = q.data_ptr(), q_out.data_ptr()
    aligned = (
        q_ptr
        | q_out_ptr
        | kk.data_ptr()
        | kk_out.data_ptr()
        | cos.data_ptr()
        | sin.data_ptr()
        | pos.data_ptr()
    ) % 16 == 0
    if key is None:
        key = launch_key(
            q,
            k,
            cos,
            sin,
            q_out,
            k_out,
            positions,
            R,
            interleaved,
            backward,
            in_place=q_out_ptr == q_ptr,
        )
    cached = _LAUNCHES.get(key) if aligned else None
    if cached is None:
        kernel, grid, scalars = _first_launch(
            *pointers, k is not None, positions is not None, R, interleaved, backward
        )
        # kernel is None: interpreted
        if aligned and kernel is not None and direct_launch_matches():
            # a bound on memory for callers that never repeat a shape
            if len(_LAUNCHES) >= 4096:
                _LAUNCHES.clear()
            _LAUNCHES[key] = (kernel, grid, q.get_device(), scalars)
    else:
        kernel, grid, device, scalars = cached
        # What ``kernel[grid](...)`` does, without its Python wrapper: no launch hooks
        kernel.run(
            *grid,
            torch._C._cuda_getCurrentRawStream(device),
            kernel.function,
            kernel.packed_metadata,
            None,
            None,
            None,
            *pointers,
            *scalars,
        )
    return q_out, k_out


def prepare_backward(q_out, k_out, cos, sin, positions, *, interleaved, rotary_dim):
    """The backward's launch key, computed in the forward for gradients laid out like
    q_out and k_out: autograd runs the backward on a thread where the same Python costs
    several times more (chapter 6)."""
    return launch_key(
        q_out,
        k_out,
        cos,
        sin,
        q_out,
        k_out,
        positions,
        rotary_dim,
        interleaved,
        True,
        in_place=False,
    )


# The call ``JITFunction.run`` makes in the Triton versions this file was written
# for (3.6, 3.7): the cached launch makes the same call, with no launch metadata
# and no hooks.
TRITON_LAUNCH_CALL = (
    "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, "
    "kernel.packed_metadata, launch_metadata, knobs.runtime.launch_enter_hook, "
    "knobs.runtime.launch_exit_hook, *bound_args.values())"
)


@cache
def direct_launch_matches() -> bool:
    """Does the installed Triton launch a compiled kernel as the cached launch does?
    Read from its source, once: a Triton that changed the call gets the public
    ``kernel[grid](...)`` path."""
    try:
        source = inspect.getsource(triton.runtime.jit.JITFunction.run)
    except (OSError, TypeError):
        return False
    return TRITON_LAUNCH_CALL in " ".join(source.split()).replace("( ", "(")


def launch_key(
    q, k, cos, sin, q_out, k_out, positions, R, interleaved, backward, *, in_place
):
    """Everything the compiled kernel depends on but pointer alignment: shapes, strides,
    dtypes, device and options. ``_LAUNCHES`` keeps a compiled launch under this key."""
    return (
        q.shape,
        q.stride(),
        q_out.stride(),
        q.dtype,
        q_out.dtype,
        q.get_device(),
        None if k is None else (k.shape, k.stride(), k_out.stride(), k.dtype),
        cos.shape,
        cos.stride(),
        cos.dtype,
        sin.stride(),
        sin.dtype,
        None if positions is None else (positions.stride(), positions.dtype),
        R,
        interleaved,
        backward,
        in_place,
    )


def _first_launch(
    q, kk, q_out, kk_out, cos, sin, pos, has_k, has_positions, R, interleaved, backward
):
    """Launch through Triton's JIT (which compiles on first use). Returns the compiled
    kernel, the grid and every argument after the pointers, in the kernel's order, for
    the next launches."""
    B, T, HQ, D = q.shape
    HK = kk.shape[2] if has_k else 0
    BLOCK_T, BLOCK_H, BLOCK_HALF = tile_sizes(T, HQ, R // 2, PAIRS_PER_TILE)
    spb, spt = pos.stride() if has_positions else (0, 0)
    grid = (triton.cdiv(T, BLOCK_T), B, 1)
    scalars = (
        T,
        HQ,
        HK,
        R // 2,
        D,
        R,
        cos.shape[0],
        *q.stride(),
        *kk.stride(),
        *q_out.stride(),
        *kk_out.stride(),
        cos.stride(0),
        spb,
        spt,
    )
    constexprs = dict(
        HAS_POSITIONS=has_positions,
        INTERLEAVED=interleaved,
        BACKWARD=backward,
        COPY_PASS=R < D and q_out.data_ptr() != q.data_ptr(),
        FP64=q.dtype == torch.float64,
        WIDE=max(_last_offset(t) for t in (q, kk, q_out, kk_out)) >= 2**31,
        BLOCK_T=BLOCK_T,
        BLOCK_H=BLOCK_H,
        BLOCK_HALF=BLOCK_HALF,
        BLOCK_PASS=triton.next_power_of_2(max(D - R, 1)),
    )
    launch = rope_final_kernel[grid](
        q, kk, q_out, kk_out, cos, sin, pos, *scalars, **constexprs, num_warps=NUM_WARPS
    )
    return launch, grid, (*scalars, *constexprs.values())


def _last_offset(t: torch.Tensor) -> int:
    """The largest element offset from t's data pointer that indexing t reaches."""
    return sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
