"""``apply_rope``: the public entry point. Validation, then the kernel, by one of two paths.

- Eagerly: a ``torch.autograd.Function`` whose forward and backward both launch the kernel (the
  backward of a rotation by theta is the rotation by -theta, so the gradient costs exactly what
  the forward costs). With no gradient to track, a bare launch: autograd's bookkeeping costs more
  host time than a small shape's whole kernel.
- Under ``torch.compile``: the operators registered in ``ropetut.op``, which the compiler sees
  as single nodes.

Neither path reads a tensor's values on the host, so neither waits for the GPU: a call can be
captured in a CUDA graph. ``check_positions=True`` is the one exception, and says so.
"""
import torch

from .launch import check_rope_args
from .kernels.final import launch_key, rope_final
from .op import cute_fits, cute_unavailable, rope_traced, rotate, run_kernel

IMPLS = ("v1", "v2", "v3", "v4", "final")
OPTIONAL_IMPLS = ("cute",)   # the CuTeDSL kernel: needs nvidia-cutlass-dsl and a CUDA GPU
EARLY_GRADS_BYTES = 2**20    # RopeFunction allocates input gradients in its forward up to this size


class RopeFunction(torch.autograd.Function):
    """q: (B, T, Hq, D), k: (B, T, Hkv, D) or None, any strides. No gradient flows to the tables.

    ``options`` = (cos, sin, positions, interleaved, rotary_dim, inplace, impl, check_positions),
    one argument rather than eight: ``apply``'s host time grows with its number of arguments.
    Returns q_out, or (q_out, k_out).

    The backward runs on autograd's own thread for the GPU, where the same Python costs several
    times what it costs on the caller's thread (chapter 6). So the forward does ahead what it can
    for ``final``: the backward's launch key, for output gradients laid out like the outputs (the
    usual case; any other layout takes the ordinary path), and, for tensors of at most
    ``EARLY_GRADS_BYTES``, where host time is all there is, the input gradients' memory.
    """

    @staticmethod
    def forward(ctx, q, k, options):
        q_out, k_out = rotate(q, k, *options)
        if options[5]:                                    # in place
            ctx.mark_dirty(*(t for t in (q, k) if t is not None))
        ctx.options = options       # the tables are inputs, never outputs: no reference cycle
        ctx.backward_key = ctx.grads = None
        if options[6] == "final":
            cos, sin, positions, interleaved, rotary_dim = options[:5]
            ctx.backward_key = launch_key(q_out, k_out, cos, sin, q_out, k_out, positions,
                                          rotary_dim, interleaved, True, in_place=False)
            ctx.grad_strides = (q_out.stride(), None if k is None else k_out.stride())
            if q.nbytes + (0 if k is None else k.nbytes) <= EARLY_GRADS_BYTES:
                ctx.grads = (torch.empty_like(q_out), None if k is None else torch.empty_like(k_out))
        return q_out if k is None else (q_out, k_out)

    @staticmethod
    def backward(ctx, dq, dk=None):
        cos, sin, positions, interleaved, rotary_dim, _, impl, _ = ctx.options
        expected = ctx.backward_key is not None and ctx.grad_strides == (
            dq.stride(), None if dk is None else dk.stride())
        grads, ctx.grads = ctx.grads, None     # once only: a second backward gets fresh memory
        if expected and grads is not None:
            dq_in, dk_in = grads
        else:
            dq_in = torch.empty_like(dq)
            dk_in = None if dk is None else torch.empty_like(dk)
        if expected:    # dq_in is laid out like dq either way: both dense, dq's strides
            rope_final(dq, dk, cos, sin, dq_in, dk_in, positions=positions, interleaved=interleaved,
                       rotary_dim=rotary_dim, backward=True, key=ctx.backward_key)
        else:
            run_kernel(impl, dq, dk, cos, sin, dq_in, dk_in, positions=positions,
                       interleaved=interleaved, rotary_dim=rotary_dim, backward=True)
        return dq_in, dk_in, None


def apply_rope(q, k=None, cos=None, sin=None, *, positions=None, interleaved=False,
               rotary_dim=None, inplace=False, layout="bthd", impl="final", check_positions=False):
    """Rotate q (and k) by their positions. Differentiable; never waits for the GPU.

    q: (B, T, Hq, D) for layout "bthd" (the seed's), (B, H, T, D) for "bhtd" (Hugging Face's);
       any strides, so a transposed view works without a copy.
    k: like q with Hkv heads, Hq a multiple of Hkv (GQA), or None.
    cos, sin: (n_positions, rotary_dim/2) tables, see ``ropetut.rope_tables``.
    positions: None (token t at position t), or (T,) / (B, T) integers indexing the table rows.
       A position outside [0, n_positions) is never read past: that token's output is NaN.
    interleaved: pairs (x[2i], x[2i+1]) (GPT-J) instead of (x[i], x[i + rotary_dim/2]) (NeoX).
    rotary_dim: rotate only the first rotary_dim dims (default D); the rest pass through.
    inplace: overwrite q and k instead of allocating outputs.
    impl: "final" (default) or one of the teaching versions "v1".."v4", which refuse what they
       can't do: v1 has only interleaved pairs, v2-v4 only half-split ones, and none of them
       takes positions, rotary_dim or inplace. "cute": the CuTeDSL kernel (appendix), which
       needs nvidia-cutlass-dsl and a GPU, and takes half-split pairs, positions and inplace in
       fp32, fp16 and bf16, with rows it can read 16 bytes at a time.
    check_positions: raise ValueError, before anything is written, if a position is outside the
       table. It reads positions on the host, so it waits for the GPU and cannot run inside a
       CUDA graph capture: a debugging aid, off by default.
    Returns (q_out, k_out), or q_out alone when k is None, shaped and laid out like the inputs.
    """
    if cos is None or sin is None:
        raise TypeError("cos, sin: both tables are required (see ropetut.rope_tables)")
    if impl not in IMPLS + OPTIONAL_IMPLS:
        raise ValueError(f"impl: must be one of {IMPLS + OPTIONAL_IMPLS}, got {impl!r}")
    if impl == "cute" and not torch.compiler.is_compiling() and cute_unavailable():
        raise RuntimeError(cute_unavailable())
    if not isinstance(check_positions, bool):
        raise TypeError(f"check_positions: must be a bool, got {type(check_positions).__name__}")
    args = check_rope_args(q, k, cos, sin, positions, rotary_dim=rotary_dim,
                           interleaved=interleaved, inplace=inplace, layout=layout)
    if impl == "cute":
        _check_cute_supports(args, interleaved)
    elif impl != "final":
        _check_impl_supports(impl, args, positions, rotary_dim, interleaved, inplace)
    options = (args.cos, args.sin, args.positions, interleaved, args.rotary_dim, inplace, impl,
               check_positions)
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad))
    if torch.compiler.is_compiling():
        q_out, k_out = rope_traced(args.q, args.k, *options, wants_grad)
    elif not wants_grad:
        q_out, k_out = rotate(args.q, args.k, *options)
    elif inplace and k is not None:
        # Autograd lets a Function that writes into a view return one tensor only, and q and k
        # are often views (of one projection): one call each.
        q_out, k_out = RopeFunction.apply(args.q, None, options), RopeFunction.apply(args.k, None, options)
    elif k is None:
        q_out, k_out = RopeFunction.apply(args.q, None, options), None
    else:
        q_out, k_out = RopeFunction.apply(args.q, args.k, options)
    if layout == "bhtd":
        q_out = q_out.transpose(1, 2)
        k_out = None if k_out is None else k_out.transpose(1, 2)
    return q_out if k is None else (q_out, k_out)


def _check_impl_supports(impl, args, positions, rotary_dim, interleaved, inplace):
    D = args.q.shape[-1]
    for name, asked in (("positions", positions is not None), ("inplace", inplace),
                        ("rotary_dim", args.rotary_dim != D)):
        if asked:
            raise ValueError(f"{name}: impl={impl!r} does not support it; use impl='final'")
    if interleaved != (impl == "v1"):
        pairs = "interleaved" if impl == "v1" else "half-split"
        raise ValueError(f"interleaved: impl={impl!r} only has {pairs} pairs; use impl='final'")


CUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_cute_supports(args, interleaved):
    """What the CuTeDSL kernel refuses, named by argument (see ``ropetut.kernels.cute``)."""
    D = args.q.shape[-1]
    if interleaved:
        raise ValueError("interleaved: impl='cute' only has half-split pairs; use impl='final'")
    if args.rotary_dim != D:
        raise ValueError("rotary_dim: impl='cute' rotates the whole head dim; use impl='final'")
    for name, t in (("q", args.q), ("cos", args.cos)):
        if t.dtype not in CUTE_DTYPES:
            raise TypeError(f"{name}: impl='cute' takes {CUTE_DTYPES}, got {t.dtype}; use impl='final'")
    # (torch.compile traces fake tensors, which have no address: the kernel's caller copies a
    # misaligned tensor at run time instead)
    check_pointer = not torch.compiler.is_compiling()
    for name, t in (("cos", args.cos), ("sin", args.sin)):
        if check_pointer and t.data_ptr() % 16:
            raise ValueError(f"{name}: impl='cute' needs a 16-byte aligned table; pass {name}.clone()")
    vec = 16 // args.q.element_size()
    if (D // 2) % vec:
        raise ValueError(f"q: impl='cute' reads {vec} elements at a time, so D/2 must be a multiple "
                         f"of {vec}, got D={D}; use impl='final'")
    for name, t in (("q", args.q), ("k", args.k)):
        if t is None:
            continue
        if not cute_fits(t, check_pointer=check_pointer):
            raise ValueError(f"{name}: impl='cute' needs unit stride in the head dim, the other "
                             f"strides multiples of {vec} elements and a 16-byte aligned start, got "
                             f"strides {t.stride()}; pass {name}.contiguous() or use impl='final'")
        if t.numel() >= 2**31:
            raise ValueError(f"{name}: impl='cute' indexes with 32-bit integers, and {name} has "
                             f"{t.numel()} elements; use impl='final'")
