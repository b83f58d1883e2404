"""Chapter 7's exercise: partial rotary, which half-truncated RoPE is once permuted.

7.1 ``rope_partial``: turns the first R = ``rotary_dim`` dims (pairs (i, i + R/2)) and
    must copy dims R..D-1 to the output unchanged; as shipped it never writes them.

The starter below is the chapter's exercise cell, verbatim (a test keeps it so); the
solution is in ``ropetut.book.exercises.solutions``. Tensors are (T, H, D), D
contiguous; the tables have R/2 columns. ``rotate_heads`` is chapter 4's helper
(``ropetut.book.exercises.ch04``).
"""

import triton
import triton.language as tl

from ...reference import rope_reference
from .ch04 import rotate_heads
from .check import exercise


@triton.jit
def rope_partial(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    H,
    D,
    HALF_R,
    stride_t,
    stride_h,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    t = tl.program_id(0)  # one program per token, all of its heads
    i = tl.arange(0, BLOCK_HALF)[None, :]  # pair index, i < HALF_R = R/2
    cos = tl.load(cos_ptr + t * HALF_R + i, mask=i < HALF_R)
    sin = tl.load(sin_ptr + t * HALF_R + i, mask=i < HALF_R)
    # dims 0..R-1: pairs (i, i + HALF_R), turned
    rotate_heads(
        x_ptr, out_ptr, t, cos, sin, H, HALF_R, stride_t, stride_h, BLOCK_H, BLOCK_HALF
    )
    # ---- exercise 7.1: dims R..D-1 do not turn; out of place, copy them to out ----
    # ---- end of exercise ----


def launch_partial(kernel, x, cos, sin, out, rotary_dim):
    """One program per token. x, out: (T, H, D) with one layout, D contiguous; cos, sin:
    (n_positions, rotary_dim/2)."""
    T, H, D = x.shape
    assert out.stride() == x.stride() and x.stride(2) == 1
    kernel[(T,)](
        x,
        out,
        cos,
        sin,
        H,
        D,
        rotary_dim // 2,
        x.stride(0),
        x.stride(1),
        BLOCK_H=triton.next_power_of_2(H),
        BLOCK_HALF=triton.next_power_of_2(rotary_dim // 2),
        BLOCK_PASS=triton.next_power_of_2(D - rotary_dim),
    )
    return out


@exercise("ch07.partial", (dict(T=4, H=2, D=32, R=16), dict(T=5, H=3, D=96, R=48)))
def _run_partial(kernel, lab, T, H, D, R):
    cos, sin = lab.tables(R, T + 4)  # the standard spectrum of an R-dim head
    x = lab.randn("x", T, H, D)
    out = lab.empty("out", T, H, D)
    launch_partial(kernel, x, cos, sin, out, R)
    ref = rope_reference(x[None], cos, sin, rotary_dim=R)[0]
    if out[..., R:].isnan().all():
        lab.problems.append(
            f"out: d {R}..{D - 1} were never written (NaN): out of place, copy the "
            "dims that do not turn"
        )
        return
    lab.compare("out", out, ref)
