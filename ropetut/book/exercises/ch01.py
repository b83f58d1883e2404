"""Chapter 1's exercise: RoPE from scratch, in plain PyTorch; kernels come in chapter 3.

1.1 ``rope_from_scratch``: the frequencies and the rotation; as shipped it returns x
    unturned.

The starter below is the chapter's exercise cell, verbatim (a test keeps it so); the
solution is in ``ropetut.book.exercises.solutions``. x is (T, H, D), one sequence,
token t at position t.
"""

import torch

from ...reference import rope_reference
from ...tables import rope_tables, standard
from .check import exercise


def rope_from_scratch(x, base=10000.0):
    """x (T, H, D), token t at position t, turned by RoPE: half-split pairs, float64."""
    T, H, D = x.shape
    p = torch.arange(T, dtype=torch.float64, device=x.device)  # positions
    i = torch.arange(D // 2, dtype=torch.float64, device=x.device)  # pair index
    x1 = x[..., : D // 2].double()  # pair i is (x1[..., i], x2[..., i])
    x2 = x[..., D // 2 :].double()
    # ---- exercise 1.1: omega_i = base^(-2i/D); turn pair i by p * omega_i ----
    omega = torch.ones_like(i)  # omega_i, radians per position
    angle = p[:, None, None] * omega  # (T, 1, D/2): one angle per token and pair
    y1 = x1
    y2 = x2
    # ---- end of exercise ----
    return torch.cat([y1, y2], dim=-1)


@exercise(
    "ch01.from_scratch",
    (dict(T=4, H=2, D=32), dict(T=5, H=3, D=96, base=500000.0)),
)
def _run_from_scratch(fn, lab, T, H, D, base=10000.0):
    x = lab.randn("x", T, H, D)
    out = fn(x, base)

    def ref(freqs, **kw):
        cos, sin = rope_tables(freqs, T, dtype=torch.float64)
        return rope_reference(x[None], cos, sin, **kw)[0]

    freqs = standard(D, base)
    lab.compare(
        "out",
        out,
        ref(freqs),
        wrong_answers=[
            ("equals the input x: nothing was rotated", x.double().cpu()),
            (
                "is turned by -theta: check the signs of the sin terms",
                ref(freqs, inverse=True),
            ),
            (
                "turns every pair at 1 radian per position: omega_i = base^(-2i/D)",
                ref(torch.ones(D // 2, dtype=torch.float64)),
            ),
            (
                "uses omega_i = base^(-i/D): the exponent is -2i/D",
                ref(base ** (-torch.arange(D // 2, dtype=torch.float64) / D)),
            ),
        ],
    )
