"""``apply_rope``: the public entry point. Validation, then the kernel, by one of two
paths.

- Eagerly: a ``torch.autograd.Function`` whose forward and backward both launch the
  kernel (the backward of a rotation by theta is the rotation by -theta, so the gradient
  costs exactly what the forward costs). With no gradient to track, a bare launch:
  autograd's bookkeeping costs more host time than a small shape's whole kernel.
- Under ``torch.compile``: the operators registered in ``ropetut.op``, which the
  compiler sees as single nodes.

Neither path reads a tensor's values on the host, so neither waits for the GPU: a call
can be captured in a CUDA graph. ``check_positions=True`` is the one exception, and says
so.
"""

import torch

from .kernels import rotate
from .op import rope_traced
from .validate import check_rope_args

# RopeFunction allocates input gradients in its forward up to this size
EARLY_GRADS_BYTES = 2**20


def _is_inference(t):
    return t is not None and t.is_inference()


def save_for_backward(ctx, *tensors):
    """``ctx.save_for_backward(*tensors)`` (None entries too), so that a write in place
    to one of them between the forward and the backward raises there, as for torch's
    own ops. An inference tensor (made under ``torch.inference_mode()``, as tables built
    there are) cannot be saved, nor written outside inference mode: it is kept on ctx.
    ``saved_tensors`` gives them all back, in order."""
    ctx.kept = None
    for t in tensors:  # (a loop: any(map(...)) costs more host time, on every call)
        if t is not None and t.is_inference():
            ctx.kept = [x if _is_inference(x) else None for x in tensors]
            tensors = [None if _is_inference(x) else x for x in tensors]
            break
    ctx.save_for_backward(*tensors)


def saved_tensors(ctx):
    """The tensors given to ``save_for_backward``."""
    saved = ctx.saved_tensors
    if ctx.kept is None:
        return saved
    return tuple(s if kept is None else kept for s, kept in zip(saved, ctx.kept))


class RopeFunction(torch.autograd.Function):
    """q: (B, T, Hq, D), k: (B, T, Hkv, D) or None, any strides; ``options``: a
    ``RopeOptions``, one argument rather than nine (``apply``'s host time grows with its
    number of arguments). Returns q_out, or (q_out, k_out). No gradient flows to the
    tables. The tables and positions are saved, so a write to one in place before the
    backward raises there.

    The backward is the same kernel turning by -theta. With ``create_graph=True`` it
    goes through this Function again, so it is differentiable too: the second derivative
    is a turn by +theta.

    The backward runs on autograd's own thread for the GPU, where the same Python costs
    several times what it costs on the caller's thread (chapter 6). So the forward does
    ahead what it can, for a kernel with a ``prepare_backward`` (``final``): the
    backward's launch, for output gradients laid out like the outputs (the usual case;
    any other layout takes the ordinary path), and, for tensors of at most
    ``EARLY_GRADS_BYTES``, where host time is all there is, the input gradients' memory.
    """

    @staticmethod
    def forward(ctx, q, k, options):
        q_out, k_out = rotate(q, k, options)
        if options.inplace:
            ctx.mark_dirty(*(t for t in (q, k) if t is not None))
        cos, sin, positions, interleaved, rotary_dim, _, kernel, _, backward = options
        save_for_backward(ctx, cos, sin, positions)
        # the backward's options are made only where it needs them
        ctx.options = options
        ctx.prepared = ctx.grads = None
        if (
            kernel.prepare_backward is not None
            and not backward
            and q.numel()
            and (k is None or k.numel())
        ):
            ctx.prepared = kernel.prepare_backward(
                q_out,
                k_out,
                cos,
                sin,
                positions,
                interleaved=interleaved,
                rotary_dim=rotary_dim,
            )
            ctx.grad_strides = (q_out.stride(), None if k is None else k_out.stride())
            if q.nbytes + (0 if k is None else k.nbytes) <= EARLY_GRADS_BYTES:
                ctx.grads = (
                    empty_strided_like(q_out),
                    None if k is None else empty_strided_like(k_out),
                )
        return q_out if k is None else (q_out, k_out)

    @staticmethod
    def backward(ctx, dq, dk=None):
        options = ctx.options
        cos, sin, positions = saved_tensors(ctx)
        prepared = (
            ctx.prepared is not None
            and not torch.is_grad_enabled()
            and (ctx.grad_strides == (dq.stride(), None if dk is None else dk.stride()))
        )
        if not prepared:  # the turn back, out of place, by the registry's ordinary path
            back = options._replace(
                cos=cos,
                sin=sin,
                positions=positions,
                inplace=False,
                check_positions=False,
                backward=not options.backward,
            )
            if torch.is_grad_enabled():
                # create_graph=True: through this Function again, so the gradient is
                # differentiable
                grads = RopeFunction.apply(dq, dk, back)
                return (grads, None, None) if dk is None else (*grads, None)
            return (*rotate(dq, dk, back), None)
        # once only: a second backward gets fresh memory
        grads, ctx.grads = ctx.grads, None
        if grads is None:  # with dq's strides, gaps too, as the prepared launch expects
            grads = (
                empty_strided_like(dq),
                None if dk is None else empty_strided_like(dk),
            )
        options.kernel.launch(
            dq,
            dk,
            cos,
            sin,
            *grads,
            positions=positions,
            interleaved=options.interleaved,
            rotary_dim=options.rotary_dim,
            backward=True,
            prepared=ctx.prepared,
        )
        return (*grads, None)


def empty_strided_like(t):
    """Memory for a tensor of t's shape, strides (gaps too), dtype and device, for a
    prepared launch whose key names t's strides (``empty_like`` makes a tensor with
    gaps contiguous). t may not overlap itself: an output, or a gradient laid out as
    one."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def apply_rope(
    q,
    k=None,
    cos=None,
    sin=None,
    *,
    positions=None,
    interleaved=False,
    rotary_dim=None,
    inplace=False,
    layout="bthd",
    impl="final",
    check_positions=False,
):
    """Rotate q (and k) by their positions. Differentiable; never waits for the GPU.

    q: (B, T, Hq, D) for layout "bthd" (the seed's), (B, H, T, D) for "bhtd" (Hugging
       Face's); any strides, so a transposed view works without a copy.
    k: like q with Hkv heads, Hq a multiple of Hkv (GQA), or None.
    cos, sin: (n_positions, rotary_dim/2) tables, see ``ropetut.rope_tables``.
    positions: None (token t at position t), or (T,) / (B, T) integers indexing the
       table rows. A position outside [0, n_positions) is never read past: that token's
       output is NaN.
    interleaved: pairs (x[2i], x[2i+1]) (GPT-J) instead of (x[i], x[i + rotary_dim/2])
       (NeoX).
    rotary_dim: rotate only the first rotary_dim dims (default D); the rest pass
       through.
    inplace: overwrite q and k instead of allocating outputs. As torch's own in-place
       ops: q's and k's version counters are bumped, and memory written twice (an
       expand()ed q, a k that shares elements with q) or a write autograd could not
       record (a leaf that requires grad, a view from unbind) is refused, before
       anything is written.
    impl: "final" (default), one of the teaching versions "v1".."v4", or "cute" (the
       appendix's CuTeDSL kernel: needs nvidia-cutlass-dsl and a GPU). What each can do
       is its ``Supports`` record in ``ropetut.kernels.KERNELS``; the rest is refused,
       naming the argument.
    check_positions: raise ValueError, before anything is written, if a position is
       outside the table. It reads positions on the host, so it waits for the GPU and
       cannot run inside a CUDA graph capture: a debugging aid, off by default.
    Returns (q_out, k_out), or q_out alone when k is None, shaped and laid out like the
    inputs; empty inputs give empty outputs. Differentiable to any order in q and k; cos
    and sin get no gradient, so tables that require one are refused.
    """
    if cos is None or sin is None:
        raise TypeError("cos, sin: both tables are required (see ropetut.rope_tables)")
    wants_grad = torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
    )
    q4, k4, options = check_rope_args(
        q,
        k,
        cos,
        sin,
        positions,
        kernel=impl,
        rotary_dim=rotary_dim,
        interleaved=interleaved,
        inplace=inplace,
        layout=layout,
        check_positions=check_positions,
        wants_grad=wants_grad,
    )
    # (in place: the traced graph's copy_ checks as torch does)
    if torch.compiler.is_compiling():
        q_out, k_out = rope_traced(q4, k4, options, wants_grad)
    elif not wants_grad:
        q_out, k_out = rotate(q4, k4, options)
    elif inplace and k is not None:
        # Autograd lets a Function that writes into a view return one tensor only, and q
        # and k are often views (of one projection): one call each.
        q_out, k_out = (
            RopeFunction.apply(q4, None, options),
            RopeFunction.apply(k4, None, options),
        )
    elif k is None:
        q_out, k_out = RopeFunction.apply(q4, None, options), None
    else:
        q_out, k_out = RopeFunction.apply(q4, k4, options)
    if layout == "bhtd":
        q_out = q_out.transpose(1, 2)
        k_out = None if k_out is None else k_out.transpose(1, 2)
    return q_out if k is None else (q_out, k_out)
