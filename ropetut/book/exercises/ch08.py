"""Chapter 8's exercise: cos and sin at long-context positions, in plain PyTorch.

8.1 ``rope_long_context``: tokens sit at positions past a million. As shipped it
    computes the angles p * theta in float32, as most implementations do, and a float32
    angle between 2^20 and 2^21 is off by up to 0.06 radians. The fix: angles in
    float64, cos and sin rounded to float32 last.

The starter below is the chapter's exercise cell, verbatim (a test keeps it so); the
solution is in ``ropetut.book.exercises.solutions``. x is (T, H, D) float32; the output
keeps its dtype.
"""

import torch

from ...reference import rope_reference
from ...tables import standard
from .check import exercise


def rope_long_context(x, positions, freqs):
    """x (T, H, D) float32, token t at position positions[t] (int64, up to millions);
    freqs (D/2,) float64. Half-split pairs turned by +theta; returns float32."""
    # ---- exercise 8.1: angles in float64; cos and sin rounded to float32 last ----
    angle = positions.float()[:, None] * freqs.float()[None, :]  # (T, D/2)
    cos, sin = angle.cos(), angle.sin()
    # ---- end of exercise ----
    cos, sin = cos[:, None, :], sin[:, None, :]  # (T, 1, D/2): every head alike
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


FAR = 2**20  # positions from FAR to 2 FAR: a context of one to two million tokens


@exercise("ch08.long_context", (dict(T=4, H=2, D=32), dict(T=5, H=3, D=96)))
def _run_long_context(fn, lab, T, H, D):
    x = lab.randn("x", T, H, D)
    freqs = standard(D).to(x.device)
    positions = FAR + lab.positions(T, FAR)
    out = fn(x, positions, freqs)
    if out.dtype != x.dtype:
        lab.problems.append(
            f"out: is {out.dtype}, x is {x.dtype}: round cos and sin to x's dtype"
        )
        return

    def ref(p):  # rows of float64 tables at positions p: row t for token t
        angle = p.double()[:, None] * freqs[None, :]
        return rope_reference(x[None], angle.cos(), angle.sin())[0]

    angle32 = positions.float()[:, None] * freqs.float()[None, :]
    lab.compare(
        "out",
        out,
        ref(positions),
        wrong_answers=[
            (
                "is RoPE with angles rounded to float32: compute p * theta in float64",
                rope_reference(x[None], angle32.cos(), angle32.sin())[0],
            ),
            (
                "is RoPE at positions rounded to bfloat16: keep positions exact",
                ref(positions.bfloat16().double()),
            ),
        ],
    )
