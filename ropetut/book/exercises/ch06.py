"""Chapter 6's exercise: a decode kernel that checks its positions on the GPU.

6.1 ``rope_decode``: token t sits at ``positions[t]``; a position outside the table must
    read no table row and give NaN, as ``final`` does, so that ``apply_rope`` needs no
    check on the host and can be captured in a CUDA graph. As shipped it reads whatever
    row it is given.

The starter below is the chapter's exercise cell, verbatim (a test keeps it so); the
solution is in ``ropetut.book.exercises.solutions``. Tensors are (T, H, D), D
contiguous: T tokens, one new token per sequence. ``rotate_heads`` is chapter 4's helper
(``ropetut.book.exercises.ch04``).
"""

import torch
import triton
import triton.language as tl

from ...reference import rope_reference
from .ch04 import rotate_heads
from .check import exercise


@triton.jit
def rope_decode(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    N_POS,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0)  # one program per token
    i = tl.arange(0, BLOCK_HALF)[None, :]
    p = tl.load(pos_ptr + t)  # its position: a row of the (N_POS, HALF) table, or not
    # ---- exercise 6.1: p outside [0, N_POS): read no row, and make cos, sin NaN ----
    cos = tl.load(cos_ptr + p * HALF + i, mask=i < HALF)
    sin = tl.load(sin_ptr + p * HALF + i, mask=i < HALF)
    # ---- end of exercise ----
    rotate_heads(
        x_ptr, out_ptr, t, cos, sin, H, HALF, stride_t, stride_h, BLOCK_H, BLOCK_HALF
    )


def launch_decode(kernel, x, cos, sin, positions, out):
    """One program per token. x, out: (T, H, D) with one layout, D contiguous; cos, sin:
    (n_positions, D/2), contiguous; positions: (T,) integers, any value."""
    T, H, D = x.shape
    assert out.stride() == x.stride() and x.stride(2) == 1
    kernel[(T,)](
        x,
        out,
        cos,
        sin,
        positions,
        cos.shape[0],
        H,
        D // 2,
        x.stride(0),
        x.stride(1),
        BLOCK_H=triton.next_power_of_2(H),
        BLOCK_HALF=triton.next_power_of_2(D // 2),
    )
    return out


def _framed(table, g, rows=2):
    """``table`` inside a larger buffer, ``rows`` random rows before and after it: a
    read just outside the table stays in memory and returns numbers, not NaN."""
    n, half = table.shape
    buf = torch.randn(n + 2 * rows, half, generator=g).to(table.device)
    buf[rows : rows + n] = table
    return buf[rows : rows + n]


@exercise("ch06.decode", (dict(T=4, H=2, D=32), dict(T=5, H=3, D=96)))
def _run_decode(kernel, lab, T, H, D):
    n_positions = 2 * T + 3
    cos, sin = (_framed(tab, lab.g) for tab in lab.tables(D, n_positions))
    x = lab.randn("x", T, H, D)
    positions = lab.positions(T, n_positions)
    positions[1], positions[-1] = n_positions, -1  # two rows the table does not have
    bad = (positions < 0) | (positions >= n_positions)
    out = lab.empty("out", T, H, D)
    out[bad] = 0.0  # as torch.empty might hold: a token left unwritten is not NaN
    launch_decode(kernel, x, cos, sin, positions, out)
    inside = positions.clamp(0, n_positions - 1)
    ref = rope_reference(x[None], cos, sin, positions=inside)[0].cpu()
    bad, got = bad.cpu(), out.detach().double().cpu()
    if not got[bad].isnan().all():
        where = ", ".join(str(t) for t in bad.nonzero().flatten().tolist())
        rows = ", ".join(str(p) for p in positions[bad].tolist())
        lab.problems.append(
            f"out: tokens t {where} sit outside the table (positions {rows}): "
            "they must come out NaN"
        )
        return
    lab.compare(
        "out",
        got.masked_fill(bad[:, None, None], 0.0),
        ref.masked_fill(bad[:, None, None], 0.0),
        wrong_answers=[
            (
                "is RoPE at positions 0..T-1: the kernel ignores `positions`",
                rope_reference(x[None], cos, sin)[0]
                .cpu()
                .masked_fill(bad[:, None, None], 0),
            ),
        ],
    )
