"""``apply_rope_angles``: RoPE with no table. The kernel computes each angle from
``inv_freq`` and the token's position (``ropetut/kernels/angles.py`` says how).

It is a module of its own, not a ``KERNELS`` entry: a registry launcher takes cos and
sin tables, and this one takes frequencies instead. Validation, then an
autograd.Function whose backward is the same kernel turning by -theta, as
``apply_rope`` does.
"""

import torch

from .kernels.angles import rope_angles, turn_words
from .runtime import DEVICE, INTERPRETED
from .validate import (
    LAYOUTS,
    _as_bthd,
    _check_tensor,
    check_autograd_allows_inplace,
    check_no_overlap,
)


class AnglesFunction(torch.autograd.Function):
    """q: (B, T, Hq, D), k: (B, T, Hkv, D) or None; words: ``turn_words``'s;
    options: (positions, interleaved, rotary_dim, inplace, backward). Returns q_out or
    (q_out, k_out). No gradient flows to inv_freq or positions."""

    @staticmethod
    def forward(ctx, q, k, words, options):
        q_out, k_out = _rotate(q, k, words, options)
        if options[3]:  # in place
            ctx.mark_dirty(*(t for t in (q, k) if t is not None))
        ctx.save_for_backward(words)
        ctx.options = options
        return q_out if k is None else (q_out, k_out)

    @staticmethod
    def backward(ctx, dq, dk=None):
        (words,) = ctx.saved_tensors
        positions, interleaved, rotary_dim, _, backward = ctx.options
        back = (positions, interleaved, rotary_dim, False, not backward)
        if torch.is_grad_enabled():  # create_graph=True: differentiable, through here
            grads = AnglesFunction.apply(dq, dk, words, back)
            return (grads, None, None, None) if dk is None else (*grads, None, None)
        return (*_rotate(dq, dk, words, back), None, None)


def apply_rope_angles(q, k=None, inv_freq=None, *, positions=None, interleaved=False,
                      rotary_dim=None, inplace=False, layout="bthd"):  # fmt: skip
    """Rotate q (and k) by ``position * inv_freq``, computed in the kernel: no table.

    q, k, positions, interleaved, rotary_dim, inplace, layout: as ``apply_rope``.
    Positions are int64 (or int32) values in [0, 2**36): a token outside gets NaN.
    inv_freq: (rotary_dim/2,) float32 or float64 frequencies, e.g. from
       ``ropetut.scaling``; float64 keeps the frequencies' own low bits. Multiply the
       output by a variant's ``attention_factor`` where it is not 1.
    Returns (q_out, k_out), or q_out alone when k is None. Never waits for the GPU."""
    wants_grad = torch.is_grad_enabled() and (
        getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
    )
    q4, k4, words, options = check_angle_args(
        q, k, inv_freq, positions, interleaved=interleaved, rotary_dim=rotary_dim,
        inplace=inplace, layout=layout, wants_grad=wants_grad,
    )  # fmt: skip
    if not wants_grad:
        q_out, k_out = _rotate(q4, k4, words, options)
    elif inplace and k is not None:  # (autograd: one view written per Function call)
        q_out = AnglesFunction.apply(q4, None, words, options)
        k_out = AnglesFunction.apply(k4, None, words, options)
    elif k is None:
        q_out, k_out = AnglesFunction.apply(q4, None, words, options), None
    else:
        q_out, k_out = AnglesFunction.apply(q4, k4, words, options)
    if layout == "bhtd":
        q_out = q_out.transpose(1, 2)
        k_out = None if k_out is None else k_out.transpose(1, 2)
    return q_out if k is None else (q_out, k_out)


def check_angle_args(q, k, inv_freq, positions, *, interleaved, rotary_dim, inplace,
                     layout, wants_grad):  # fmt: skip
    """As ``validate.check_rope_args``, with inv_freq for the tables: TypeError or
    ValueError naming the argument, before anything is written. Returns (q, k) as
    (B, T, H, D) views, the kernel's frequency words and the options tuple."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {LAYOUTS}, got {layout!r}")
    for name, flag in (("interleaved", interleaved), ("inplace", inplace)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: must be a bool, got {type(flag).__name__}")
    _check_tensor(q, "q", layout)
    q4 = _as_bthd(q, layout)
    B, T, Hq, D = q4.shape
    k4 = None
    if k is not None:
        _check_tensor(k, "k", layout)
        if k.dtype != q.dtype:
            raise TypeError(f"k: dtype {k.dtype} differs from q's {q.dtype}")
        k4 = _as_bthd(k, layout)
        if (k4.shape[0], k4.shape[1], k4.shape[3]) != (B, T, D):
            raise ValueError(f"k: (batch, seq, head_dim) must match q's {(B, T, D)}")
        if k4.shape[2] and Hq % k4.shape[2]:
            raise ValueError(
                f"k: q's {Hq} heads are not a multiple of k's {k4.shape[2]}"
            )
    R = D if rotary_dim is None else rotary_dim
    if isinstance(R, bool) or not isinstance(R, int):
        raise TypeError(f"rotary_dim: must be an int, got {type(R).__name__}")
    if R <= 0 or R % 2 or R > D:
        raise ValueError(f"rotary_dim: must be even and in [2, D={D}], got {R}")
    if not isinstance(inv_freq, torch.Tensor):
        raise TypeError(
            f"inv_freq: must be a torch.Tensor, got {type(inv_freq).__name__}"
        )
    if inv_freq.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"inv_freq: dtype must be float32 or float64, got {inv_freq.dtype}"
        )
    if tuple(inv_freq.shape) != (R // 2,):
        raise ValueError(
            f"inv_freq: must be (rotary_dim/2,) = {(R // 2,)}, got "
            f"{tuple(inv_freq.shape)}"
        )
    if inv_freq.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "inv_freq: requires grad, but no gradient flows to it; detach it"
        )
    if positions is not None:
        if not isinstance(positions, torch.Tensor):
            raise TypeError(
                f"positions: must be a torch.Tensor, got {type(positions).__name__}"
            )
        if positions.dtype not in (torch.int32, torch.int64):
            raise TypeError(
                f"positions: dtype must be int32 or int64, got {positions.dtype}"
            )
        if tuple(positions.shape) not in ((T,), (B, T)):
            raise ValueError(
                f"positions: shape must be (T,) = {(T,)} or (B, T) = {(B, T)}, got "
                f"{tuple(positions.shape)}"
            )
    for name, t in (("k", k), ("inv_freq", inv_freq), ("positions", positions)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, but q is on {q.device}")
    if q.device.type != DEVICE.type:
        mode = "Triton's interpreter" if INTERPRETED else "compiled GPU kernels"
        raise ValueError(f"q: ropetut runs {mode} and needs {DEVICE.type} tensors")
    if inplace:
        check_no_overlap(q4, k4, (("inv_freq", inv_freq), ("positions", positions)))
        for name, t in (("q", q), ("k", k)):
            if (
                t is not None
                and t.is_inference()
                and not torch.is_inference_mode_enabled()
            ):
                raise ValueError(
                    f"{name}: in place on an inference tensor outside "
                    "torch.inference_mode(); torch forbids it: pass inplace=False"
                )
        if wants_grad:
            for name, t in (("q", q), ("k", k)):
                if t is not None and t.requires_grad:
                    check_autograd_allows_inplace(t, name)
    positions = None if positions is None else positions.expand(B, T)
    words = turn_words(inv_freq.detach(), q.dtype)
    return q4, k4, words, (positions, interleaved, R, inplace, False)


def _rotate(q, k, words, options):
    """Allocate the outputs (none in place) and launch; an empty q or k launches nothing
    for it."""
    positions, interleaved, rotary_dim, inplace, backward = options
    q_out = q if inplace else torch.empty_like(q)
    k_out = None if k is None else (k if inplace else torch.empty_like(k))
    pairs = [(x, x_out) for x, x_out in ((q, q_out), (k, k_out)) if x is not None]
    pairs = [(x, x_out) for x, x_out in pairs if x.numel()]
    if pairs:
        (x, x_out), *rest = pairs
        y, y_out = rest[0] if rest else (None, None)
        rope_angles(x, y, words, x_out, y_out, positions=positions,
                    interleaved=interleaved, rotary_dim=rotary_dim,
                    backward=backward)  # fmt: skip
    if inplace:
        torch.autograd.graph.increment_version(q if k is None else (q, k))
    return q_out, k_out
