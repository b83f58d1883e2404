"""Chapter 2's exercise: the baseline's forward, op by op in PyTorch, heads first.

2.1 ``rope_heads_first``: x comes as (H, T, D), heads first, as attention code holds q
    and k. As shipped it lines the table up with ``x.size(-3)``, as the seed's module
    does, which here is the head axis: every token of head h is turned by the angle of
    position h.

The starter below is the chapter's exercise cell, verbatim (a test keeps it so); the
solution is in ``ropetut.book.exercises.solutions``. The check hands the function a
(H, T, D) view of a (T, H, D) tensor and reports positions in (T, H, D) terms.
"""

import torch

from ...reference import rope_reference
from .check import exercise


def rope_heads_first(x, cos, sin):
    """x (H, T, D), heads first, token t at position t; cos, sin (n_positions, D/2).
    Half-split pairs turned by +theta, in float32, as the seed's module computes."""
    # ---- exercise 2.1: line the table's rows up with x's token axis ----
    cos = cos[: x.size(-3), None, :]  # as the seed's module: rows for x.size(-3)
    sin = sin[: x.size(-3), None, :]
    # ---- end of exercise ----
    x1, x2 = x.float().chunk(2, dim=-1)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    return torch.cat((y1, y2), dim=-1).type_as(x)


@exercise("ch02.heads_first", (dict(T=4, H=2, D=32), dict(T=5, H=3, D=96)))
def _run_heads_first(fn, lab, T, H, D):
    cos, sin = lab.tables(D, T + 4)
    x = lab.randn("x", T, H, D)  # (T, H, D); the function gets it heads first
    out = fn(x.transpose(0, 1), cos, sin).transpose(0, 1)
    ref = rope_reference(x[None], cos, sin)[0]
    by_head = rope_reference(x.transpose(0, 1)[None], cos, sin)[0].transpose(0, 1)
    lab.compare(
        "out",
        out,
        ref,
        wrong_answers=[
            (
                (
                    "every token of head h is turned by the angle of position h: "
                    "the seed's NoPE bug"
                ),
                by_head,
            ),
            ("equals the input x: nothing was rotated", x.double().cpu()),
            (
                (
                    "is turned by -theta, as the seed's module turns: this function "
                    "turns by +theta"
                ),
                rope_reference(x[None], cos, sin, inverse=True)[0],
            ),
        ],
    )
