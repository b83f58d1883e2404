"""Chapter 5's exercises: the backward, positions, and in place, on chapter 4's
per-token layout.

5.1 ``rope_fwd_bwd``: ``BACKWARD`` must turn by -theta; as shipped the backward turns
    by +theta.
5.2 ``rope_positions``: token t sits at ``positions[t]``; as shipped it uses row t of
    the table.
5.3 ``rope_inplace``: writes over its input; as shipped it reads one half after
    overwriting it.

The starters are the chapter's exercise cells, verbatim; the solutions are in
``ropetut.book.exercises.solutions``. Tensors are (T, H, D), D contiguous.
``rotate_heads`` is chapter 4's helper (``ropetut.book.exercises.ch04``).
"""

import torch
import triton
import triton.language as tl

from ...reference import rope_reference
from .ch04 import rotate_heads
from .check import exercise

CASES = (dict(T=4, H=2, D=32), dict(T=5, H=3, D=96))


@triton.jit
def rope_fwd_bwd(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BACKWARD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_ptr + t * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + t * HALF + i, mask=i < HALF)
    # ---- exercise 5.1: the backward of rotating by theta is rotating by -theta ----
    if BACKWARD:
        sin = sin
    # ---- end of exercise ----
    rotate_heads(
        x_ptr, out_ptr, t, cos, sin, H, HALF, stride_t, stride_h, BLOCK_H, BLOCK_HALF
    )


@triton.jit
def rope_positions(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    # ---- exercise 5.2: token t sits at positions[t]: use that row of the table ----
    p = t
    # ---- end of exercise ----
    cos = tl.load(cos_ptr + p * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + p * HALF + i, mask=i < HALF)
    rotate_heads(
        x_ptr, out_ptr, t, cos, sin, H, HALF, stride_t, stride_h, BLOCK_H, BLOCK_HALF
    )


@triton.jit
def rope_inplace(
    x_ptr,
    cos_ptr,
    sin_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < H) & (i < HALF)
    cos = tl.load(cos_ptr + t * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + t * HALF + i, mask=i < HALF)
    row = x_ptr + t * stride_t + h * stride_h
    # ---- exercise 5.3: the result goes over x; one load below comes too late ----
    # first half: y1 = x1 cos - x2 sin
    x1 = tl.load(row + i, mask=mask)
    x2 = tl.load(row + i + HALF, mask=mask)
    tl.store(row + i, x1 * cos - x2 * sin, mask=mask)
    # second half: y2 = x2 cos + x1 sin
    x1 = tl.load(row + i, mask=mask)
    x2 = tl.load(row + i + HALF, mask=mask)
    tl.store(row + i + HALF, x2 * cos + x1 * sin, mask=mask)
    # ---- end of exercise ----


def _blocks(H, D):
    return dict(
        BLOCK_H=triton.next_power_of_2(H), BLOCK_HALF=triton.next_power_of_2(D // 2)
    )


def launch_fwd_bwd(kernel, x, cos, sin, out, *, backward=False):
    """One program per token. x, out: (T, H, D) with one layout, D contiguous."""
    T, H, D = x.shape
    assert out.stride() == x.stride() and x.stride(2) == 1
    kernel[(T,)](
        x,
        out,
        cos,
        sin,
        H,
        D // 2,
        x.stride(0),
        x.stride(1),
        BACKWARD=backward,
        **_blocks(H, D),
    )
    return out


def launch_positions(kernel, x, cos, sin, positions, out):
    """As ``launch_fwd_bwd``, with ``positions``: (T,) integers, rows of cos/sin."""
    T, H, D = x.shape
    assert out.stride() == x.stride() and x.stride(2) == 1
    kernel[(T,)](
        x,
        out,
        cos,
        sin,
        positions,
        H,
        D // 2,
        x.stride(0),
        x.stride(1),
        **_blocks(H, D),
    )
    return out


def launch_inplace(kernel, x, cos, sin):
    """One program per token; rotates x (T, H, D), D contiguous, in place."""
    T, H, D = x.shape
    assert x.stride(2) == 1
    kernel[(T,)](x, cos, sin, H, D // 2, x.stride(0), x.stride(1), **_blocks(H, D))
    return x


class RopeExercise(torch.autograd.Function):
    """Autograd around the kernel, as ``ropetut.autograd.RopeFunction`` does: the
    forward launches it with BACKWARD=False; the backward launches it on dL/dout with
    BACKWARD=True."""

    @staticmethod
    def forward(ctx, x, cos, sin, kernel, lab):
        out = lab.empty("out", *x.shape)
        launch_fwd_bwd(kernel, x, cos, sin, out, backward=False)
        ctx.save_for_backward(cos, sin)
        ctx.kernel, ctx.lab = kernel, lab
        return out

    @staticmethod
    def backward(ctx, d_out):
        cos, sin = ctx.saved_tensors
        dy = ctx.lab.copy("dL/dout", d_out)  # in the guarded layout, as x was
        dx = ctx.lab.empty("dL/dx", *d_out.shape)
        launch_fwd_bwd(ctx.kernel, dy, cos, sin, dx, backward=True)
        return dx, None, None, None, None


@exercise("ch05.backward", CASES)
def _run_backward(kernel, lab, T, H, D):
    cos, sin = lab.tables(D, T + 4)
    x = lab.randn("x", T, H, D).requires_grad_()
    g = torch.randn(T, H, D, generator=lab.g).to(x.device)
    out = RopeExercise.apply(x, cos, sin, kernel, lab)
    out.backward(g)
    dx = lab.views["dL/dx"]  # what the backward launch wrote
    lab.compare("out", out, rope_reference(x[None], cos, sin)[0])
    lab.compare(
        "dL/dx",
        dx,
        rope_reference(g[None], cos, sin, inverse=True)[0],
        wrong_answers=[
            (
                (
                    "is dL/dout turned by +theta, the forward's rotation: the backward "
                    "turns by -theta"
                ),
                rope_reference(g[None], cos, sin)[0],
            ),
        ],
    )


@exercise("ch05.positions", CASES)
def _run_positions(kernel, lab, T, H, D):
    n_positions = 2 * T + 3
    cos, sin = lab.tables(D, n_positions)
    x = lab.randn("x", T, H, D)
    positions = lab.positions(T, n_positions)
    out = lab.empty("out", T, H, D)
    launch_positions(kernel, x, cos, sin, positions, out)
    lab.compare(
        "out",
        out,
        rope_reference(x[None], cos, sin, positions=positions)[0],
        wrong_answers=[
            (
                "is RoPE at positions 0..T-1: the kernel ignores `positions`",
                rope_reference(x[None], cos, sin)[0],
            ),
        ],
    )


@exercise("ch05.inplace", CASES)
def _run_inplace(kernel, lab, T, H, D):
    cos, sin = lab.tables(D, T + 4)
    x = lab.randn("x", T, H, D, may_change=True)
    x0 = x.double().cpu()
    launch_inplace(kernel, x, cos, sin)
    c, s = cos.double().cpu()[:T, None, :], sin.double().cpu()[:T, None, :]
    x1, x2 = x0.chunk(2, dim=-1)
    y1 = x1 * c - x2 * s
    lab.compare(
        "x",
        x,
        rope_reference(x0[None], cos, sin)[0],
        wrong_answers=[
            ("is unchanged: nothing was written back", x0),
            (
                (
                    "has the right first half; the second half was computed from the "
                    "first half's new values: load every input before you store over it"
                ),
                torch.cat((y1, x2 * c + y1 * s), -1),
            ),
        ],
    )
