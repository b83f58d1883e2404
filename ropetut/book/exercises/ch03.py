"""Chapter 3's exercises: V1's layout, one program per (token, head) row, interleaved
pairs.

3.1 ``rope_interleaved``: the rotation is missing; as shipped the kernel copies its
    input.
3.2 ``rope_any_d``: no mask; right when D/2 is a power of two, wrong for D = 96.

The starters below are the chapter's exercise cells, verbatim (a test keeps them so);
the solutions are in ``ropetut.book.exercises.solutions``. Tensors are (T, H, D), one
sequence, with D contiguous; x and out share one layout, so one pair of strides serves
both.
"""

import triton
import triton.language as tl

from ...reference import rope_reference
from .check import exercise

# the last: D/2 = 48, not a power of two
CASES = (dict(T=4, H=2, D=32), dict(T=5, H=3, D=96))


@triton.jit
def rope_interleaved(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_HALF: tl.constexpr,
):
    row = tl.program_id(0)  # one program per (token, head) row, as in V1
    t = row // H
    h = row % H
    i = tl.arange(0, BLOCK_HALF)  # pair index
    mask = i < HALF
    cos = tl.load(cos_ptr + t * HALF + i, mask=mask)
    sin = tl.load(sin_ptr + t * HALF + i, mask=mask)
    x_row = x_ptr + t * stride_t + h * stride_h
    x1 = tl.load(x_row + 2 * i, mask=mask)  # even dims
    x2 = tl.load(x_row + 2 * i + 1, mask=mask)  # odd dims
    # ---- exercise 3.1: turn each pair (x1, x2) by its angle (cos, sin) ----
    y1 = x1
    y2 = x2
    # ---- end of exercise ----
    o_row = out_ptr + t * stride_t + h * stride_h
    tl.store(o_row + 2 * i, y1, mask=mask)
    tl.store(o_row + 2 * i + 1, y2, mask=mask)


@triton.jit
def rope_any_d(
    x_ptr,
    out_ptr,
    cos_ptr,
    sin_ptr,
    H,
    HALF,
    stride_t,
    stride_h,
    BLOCK_HALF: tl.constexpr,
):
    row = tl.program_id(0)
    t = row // H
    h = row % H
    i = tl.arange(0, BLOCK_HALF)  # BLOCK_HALF = next power of two >= HALF
    # ---- exercise 3.2: lanes i >= HALF have no pair: they must not load or store ----
    cos = tl.load(cos_ptr + t * HALF + i)
    sin = tl.load(sin_ptr + t * HALF + i)
    x_row = x_ptr + t * stride_t + h * stride_h
    x1 = tl.load(x_row + 2 * i)
    x2 = tl.load(x_row + 2 * i + 1)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    o_row = out_ptr + t * stride_t + h * stride_h
    tl.store(o_row + 2 * i, y1)
    tl.store(o_row + 2 * i + 1, y2)
    # ---- end of exercise ----


def launch_rows(kernel, x, cos, sin, out):
    """One program per (token, head) row. x, out: (T, H, D) with one layout, D
    contiguous."""
    T, H, D = x.shape
    assert out.stride() == x.stride() and x.stride(2) == 1
    kernel[(T * H,)](
        x,
        out,
        cos,
        sin,
        H,
        D // 2,
        x.stride(0),
        x.stride(1),
        BLOCK_HALF=triton.next_power_of_2(D // 2),
    )
    return out


def _run_rows(kernel, lab, T, H, D):
    cos, sin = lab.tables(D, T + 4)
    x = lab.randn("x", T, H, D)
    out = lab.empty("out", T, H, D)
    launch_rows(kernel, x, cos, sin, out)
    ref = lambda **kw: rope_reference(x[None], cos, sin, **kw)[0]
    lab.compare(
        "out",
        out,
        ref(interleaved=True),
        wrong_answers=[
            ("equals the input x: nothing was rotated", x.double().cpu()),
            (
                "is half-split RoPE, pairs (i, i + D/2); this kernel pairs (2i, 2i+1)",
                ref(),
            ),
            (
                "is turned by -theta: check the signs of the sin terms",
                ref(interleaved=True, inverse=True),
            ),
        ],
    )


exercise("ch03.interleaved", CASES)(_run_rows)
exercise("ch03.mask", CASES)(_run_rows)
