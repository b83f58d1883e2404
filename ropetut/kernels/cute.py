"""cute: the final kernel's job, half-split pairs, written in NVIDIA's CuTeDSL
instead of Triton.

What changes from Triton, and why it is here:
- Triton programs a *block*: one program loads a tile of tokens x heads x pairs and
  the compiler decides how threads share it. CuTeDSL programs a *thread*: we choose the
  threads per block, which elements each thread owns, and how wide its loads are.
- A CuTe tensor is a pointer plus a *layout*: a shape and a stride for every mode. We
  build the (B, T, H, D) layout from the caller's strides, so (B, H, T, D) memory is
  just other strides, as in Triton. Every index below is a coordinate; the layout turns
  it into an address.
- One thread owns VEC pairs of one (batch, token, head): VEC elements of the first
  half and the VEC matching ones of the second half, 16 bytes each, so every load and
  store is one 128-bit instruction. Threads are numbered flat over
  (chunk, head, token, batch), q heads then k heads.
- Head counts, head dim and VEC are compile-time constants (``cutlass.Constexpr``):
  dividing the flat thread number by them compiles to multiplies and shifts, with no
  runtime division. Batch and sequence length are runtime values: one compiled kernel
  serves every length.

- The compiled launcher is called through TVM-FFI: a few microseconds of host time a
  call, where CuTeDSL's default Python calling path costs tens.

It does what the benchmark needs and refuses the rest (``apply_rope`` checks, naming the
argument): half-split pairs over the whole head dim, optional (B, T) positions, GQA, any
layout with unit stride in D; fp32, fp16 and bf16; in place or not; forward and backward
(sin negated). No interleaved pairs, no partial rotary, no fp64. Out-of-range positions
give NaN, like ``final``, and never read outside the table. Importing this module
needs ``nvidia-cutlass-dsl`` and ``apache-tvm-ffi``; ``ropetut`` imports it only when
``impl="cute"`` is asked for.
"""

import cuda.bindings.driver as cuda
import cutlass
import torch

# the fast calling path; a missing package fails here, not mid-call
import tvm_ffi as _tvm_ffi  # noqa: F401
from cutlass import cute
from cutlass.cute.runtime import make_ptr

THREADS = 256  # threads per block
_CUTE_DTYPE = {
    torch.float32: cutlass.Float32,
    torch.float16: cutlass.Float16,
    torch.bfloat16: cutlass.BFloat16,
}


@cute.jit
def _rotate(
    src: cute.Tensor, dst: cute.Tensor, b, t, h, c, cos, sin, C, VEC: cutlass.Constexpr
):
    """One thread's work on one head: tile c of the first half and tile c + C
    of the second."""
    x, y = src[b, t, h, None], dst[b, t, h, None]  # one head: D elements
    x1 = cute.local_tile(x, (VEC,), (c,)).load().to(cutlass.Float32)
    x2 = cute.local_tile(x, (VEC,), (c + C,)).load().to(cutlass.Float32)
    cute.local_tile(y, (VEC,), (c,)).store((x1 * cos - x2 * sin).to(dst.element_type))
    cute.local_tile(y, (VEC,), (c + C,)).store(
        (x2 * cos + x1 * sin).to(dst.element_type)
    )


@cute.kernel
def rope_cute_kernel(
    # (B, T, H, D)
    mQ: cute.Tensor,
    mK: cute.Tensor,
    mQo: cute.Tensor,
    mKo: cute.Tensor,
    # (n_positions, D/2)
    mCos: cute.Tensor,
    mSin: cute.Tensor,
    mPos: cute.Tensor,  # (B, T)
    work: cute.Layout,  # (chunk, head, token, batch): one thread per coordinate
    HQ: cutlass.Constexpr,
    VEC: cutlass.Constexpr,
    HAS_POSITIONS: cutlass.Constexpr,
    BACKWARD: cutlass.Constexpr,
):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * THREADS + tidx
    if i < cute.size(work):
        # chunk fastest, then head, token, batch
        c, h, t, b = cute.idx2crd(i, work.shape)
        row = t
        if cutlass.const_expr(HAS_POSITIONS):
            row = mPos[b, t].to(cutlass.Int32)
        inside = row >= 0 and row < mCos.shape[0]
        nan_if_outside = cutlass.Float32(0.0)
        if not inside:  # never read past the table: NaN instead
            row = 0
            nan_if_outside = cutlass.Float32(float("nan"))
        cos = cute.local_tile(mCos[row, None], (VEC,), (c,)).load().to(cutlass.Float32)
        sin = cute.local_tile(mSin[row, None], (VEC,), (c,)).load().to(cutlass.Float32)
        cos, sin = cos + nan_if_outside, sin + nan_if_outside
        if cutlass.const_expr(BACKWARD):
            sin = -sin
        C = work.shape[0]
        if h < HQ:
            _rotate(mQ, mQo, b, t, h, c, cos, sin, C, VEC)
        else:
            _rotate(mK, mKo, b, t, h - HQ, c, cos, sin, C, VEC)


@cute.jit
def rope_cute_launch(
    q_ptr: cute.Pointer,
    k_ptr: cute.Pointer,
    qo_ptr: cute.Pointer,
    ko_ptr: cute.Pointer,
    cos_ptr: cute.Pointer,
    sin_ptr: cute.Pointer,
    pos_ptr: cute.Pointer,
    B: cutlass.Int32,
    T: cutlass.Int32,
    n_positions: cutlass.Int32,
    q_strides: tuple,
    k_strides: tuple,
    qo_strides: tuple,
    ko_strides: tuple,
    pos_strides: tuple,
    # (D/2/VEC, Hq + Hkv) again, as runtime values: STATIC_SHAPE=False
    chunks_and_heads: tuple,
    stream: cuda.CUstream,
    HQ: cutlass.Constexpr,
    HK: cutlass.Constexpr,
    D: cutlass.Constexpr,
    VEC: cutlass.Constexpr,
    HAS_POSITIONS: cutlass.Constexpr,
    BACKWARD: cutlass.Constexpr,
    STATIC_SHAPE: cutlass.Constexpr,
):
    """Host side of the kernel, traced once per compile: build the layouts,
    launch the grid."""

    # (B, T, H, D) : (sb, st, sh, 1), each stride a multiple of VEC
    def bthd(ptr, H, strides):
        sb, st, sh = (cute.assume(s, divby=VEC) for s in strides)
        return cute.make_layout((B, T, H, D), stride=(sb, st, sh, 1))

    tables = cute.make_layout((n_positions, D // 2), stride=(D // 2, 1))
    # The work layout's first two modes are compile-time constants, so turning a thread
    # number into coordinates divides by constants: a multiply and a shift, or a shift
    # alone for powers of two. STATIC_SHAPE=False makes them runtime values, to measure
    # what that saves.
    if cutlass.const_expr(STATIC_SHAPE):
        work = cute.make_layout((D // 2 // VEC, HQ + HK, T, B))
    else:
        work = cute.make_layout((*chunks_and_heads, T, B))
    rope_cute_kernel(
        cute.make_tensor(q_ptr, bthd(q_ptr, HQ, q_strides)),
        cute.make_tensor(k_ptr, bthd(k_ptr, max(HK, 1), k_strides)),
        cute.make_tensor(qo_ptr, bthd(qo_ptr, HQ, qo_strides)),
        cute.make_tensor(ko_ptr, bthd(ko_ptr, max(HK, 1), ko_strides)),
        cute.make_tensor(cos_ptr, tables),
        cute.make_tensor(sin_ptr, tables),
        cute.make_tensor(pos_ptr, cute.make_layout((B, T), stride=pos_strides)),
        work,
        HQ,
        VEC,
        HAS_POSITIONS,
        BACKWARD,
    ).launch(
        grid=(cute.ceil_div(cute.size(work), THREADS), 1, 1),
        block=(THREADS, 1, 1),
        stream=stream,
    )


# (dtypes, head counts, head dim, options) -> compiled launcher; shapes and
# strides stay runtime
_COMPILED = {}


def rope_cute(
    q,
    k,
    cos,
    sin,
    q_out,
    k_out,
    *,
    positions=None,
    backward=False,
    vector_bytes=16,
    static_shape=True,
    tvm_ffi=True,
):
    """q, q_out: (B, T, Hq, D); k, k_out: (B, T, Hkv, D) or None; unit stride in D,
    other strides multiples of 16 bytes, 16-byte aligned; q_out may be q. cos, sin:
    (n_positions, D/2), contiguous, 16-byte aligned. positions: None or (B, T) integers.
    Returns (q_out, k_out).

    The compiled launcher is called through TVM-FFI (package apache-tvm-ffi), which
    costs a few microseconds a call; CuTeDSL's own Python calling path costs tens.
    The other keywords are the appendix's experiments: narrower loads (vector_bytes,
    a power of two up to 16), head counts and head dim unknown at compile time
    (static_shape=False), and the default calling path (tvm_ffi=False)."""
    B, T, HQ, D = q.shape
    HK = 0 if k is None else k.shape[2]
    kk, kk_out = (q, q_out) if k is None else (k, k_out)  # HK = 0: no thread reaches k
    pos = q if positions is None else positions  # a placeholder pointer, never read
    vec = max(1, vector_bytes // q.element_size())
    key = (
        q.dtype,
        cos.dtype,
        pos.dtype,
        HQ,
        HK,
        D,
        vec,
        positions is not None,
        backward,
        static_shape,
        tvm_ffi,
    )
    tensors = (q, kk, q_out, kk_out, cos, sin, pos)
    scalars = (
        B,
        T,
        cos.shape[0],
        q.stride()[:3],
        kk.stride()[:3],
        q_out.stride()[:3],
        kk_out.stride()[:3],
        pos.stride()[:2] if positions is not None else (0, 0),
        (D // 2 // vec, HQ + HK),
        cuda.CUstream(torch._C._cuda_getCurrentRawStream(q.get_device())),
    )
    launch = _COMPILED.get(key)
    if launch is None:
        # compile for typed pointers: their dtypes and the alignment promised
        launch = _COMPILED[key] = cute.compile(
            rope_cute_launch,
            *map(_ptr, tensors),
            *scalars,
            HQ=HQ,
            HK=HK,
            D=D,
            VEC=vec,
            HAS_POSITIONS=positions is not None,
            BACKWARD=backward,
            STATIC_SHAPE=static_shape,
            **({"options": "--enable-tvm-ffi"} if tvm_ffi else {}),
        )
    if tvm_ffi:  # TVM-FFI takes a pointer as a plain address
        launch(*(t.data_ptr() for t in tensors), *scalars)
    else:
        launch(*map(_ptr, tensors), *scalars)
    return q_out, k_out


def _ptr(t: torch.Tensor):
    """A typed global-memory pointer to t's data. Tensors are promised 16-byte aligned
    (the caller checks); positions, read one at a time, only their element size."""
    if t.dtype in _CUTE_DTYPE:
        return make_ptr(
            _CUTE_DTYPE[t.dtype], t.data_ptr(), cute.AddressSpace.gmem, assumed_align=16
        )
    dtype = {torch.int32: cutlass.Int32, torch.int64: cutlass.Int64}[t.dtype]
    return make_ptr(
        dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=t.element_size()
    )
