"""RoPE as PyTorch operators: what ``torch.compile``, ``torch.export`` and
CUDA-graph trees see.

- ``torch.ops.ropetut.rope``: out of place, returns (q_out, k_out), differentiable
  (twice too);
- ``torch.ops.ropetut.rope_``: in place, declares that it writes q and k
  (``mutates_args``).

q and k are (B, T, H, D), any strides. Each operator validates its arguments as
``apply_rope`` does, through the kernel registry, before anything is written:
called directly, with arguments no kernel can take, it raises instead of writing
outside its tensors.

Each is registered with ``torch.library.custom_op`` and has a *fake* implementation:
the shapes, strides and dtypes of its outputs, computed without running anything, which
is all a compiler needs to trace around it. To ``torch.compile`` each is one opaque
node: no graph break, and with ``mode="reduce-overhead"`` it is captured into the CUDA
graph like any other kernel. ``rope``'s backward is ``rope`` turning by -theta. Autograd
cannot go through an operator that mutates its inputs, so ``rope_`` is for calls with
no gradient to track.

``apply_rope`` calls these operators when it is being traced. Eagerly it calls the
registry's ``rotate`` directly: the dispatcher would add host time to every call
and nothing else.
"""

import torch
from torch import Tensor

from .kernels import get_kernel, rotate
from .validate import RopeOptions, check_rope_args


def _validated(q, k, turn, inplace, impl, check_positions, backward=False):
    """The operator's arguments, checked as ``apply_rope`` checks them:
    (q, k, options). turn: (cos, sin, positions, interleaved, rotary_dim), the
    operators' arguments after q and k."""
    cos, sin, positions, interleaved, rotary_dim = turn
    pairs = {"interleaved": interleaved, "rotary_dim": rotary_dim}
    flags = {"inplace": inplace, "check_positions": check_positions}
    q, k, options = check_rope_args(
        q, k, cos, sin, positions, kernel=get_kernel(impl), **pairs, **flags
    )
    return q, k, options._replace(backward=backward)


# The schema is read from the type hints. An operator returns a fixed number of tensors,
# so without k the second output is an empty tensor.
@torch.library.custom_op("ropetut::rope", mutates_args=())
def rope(
    q: Tensor,
    k: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor | None,
    interleaved: bool,
    rotary_dim: int,
    backward: bool,
    impl: str,
    check_positions: bool,
) -> tuple[Tensor, Tensor]:
    turn = (cos, sin, positions, interleaved, rotary_dim)
    q4, k4, options = _validated(q, k, turn, False, impl, check_positions, backward)
    q_out, k_out = rotate(q4, k4, options)
    return q_out, q.new_empty(0) if k_out is None else k_out


@rope.register_fake
def _(
    q, k, cos, sin, positions, interleaved, rotary_dim, backward, impl, check_positions
):
    _validated(q, k, (cos, sin, positions, interleaved, rotary_dim), False, impl, False)
    return torch.empty_like(q), q.new_empty(0) if k is None else torch.empty_like(k)


def _save_for_backward(ctx, inputs, output):
    _, k, cos, sin, positions, interleaved, rotary_dim, backward, impl, _ = inputs
    if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:  # as apply_rope refuses them
        name = "cos" if ctx.needs_input_grad[2] else "sin"
        raise ValueError(
            f"{name}: requires grad, but ropetut computes no gradient for the "
            f"tables; pass {name}.detach()"
        )
    ctx.save_for_backward(cos, sin, positions)
    ctx.options = (k is not None, interleaved, rotary_dim, backward, impl)


def _backward(ctx, dq, dk):
    """The gradient of a turn by theta is the turn by -theta: ``rope`` again, so
    differentiable."""
    cos, sin, positions = ctx.saved_tensors
    has_k, interleaved, rotary_dim, backward, impl = ctx.options
    turn = (cos, sin, positions, interleaved, rotary_dim)
    dq_in, dk_in = rope(dq, dk if has_k else None, *turn, not backward, impl, False)
    # a gradient for q and k; None for rope's 8 other arguments
    return (dq_in, dk_in if has_k else None) + (None,) * 8


rope.register_autograd(_backward, setup_context=_save_for_backward)


@torch.library.custom_op("ropetut::rope_", mutates_args=("q", "k"))
def rope_(
    q: Tensor,
    k: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor | None,
    interleaved: bool,
    rotary_dim: int,
    impl: str,
    check_positions: bool,
) -> None:
    turn = (cos, sin, positions, interleaved, rotary_dim)
    rotate(*_validated(q, k, turn, True, impl, check_positions))


@rope_.register_fake
def _(q, k, cos, sin, positions, interleaved, rotary_dim, impl, check_positions):
    _validated(q, k, (cos, sin, positions, interleaved, rotary_dim), True, impl, False)


def rope_traced(q, k, options: RopeOptions, wants_grad: bool):
    """What ``apply_rope`` calls under ``torch.compile``, on validated (B, T, H, D)
    views."""
    turn = options[:5]  # (cos, sin, positions, interleaved, rotary_dim)
    impl, check_positions = options.kernel.name, options.check_positions
    if options.inplace and not wants_grad:
        rope_(q, k, *turn, impl, check_positions)
        return q, k
    q_out, k_out = rope(q, k, *turn, False, impl, check_positions)
    k_out = None if k is None else k_out
    if options.inplace:
        # with a gradient, autograd cannot go through rope_: rotate, then write back
        q.copy_(q_out)
        if k is not None:
            k.copy_(k_out)
        return q, k
    return q_out, k_out
