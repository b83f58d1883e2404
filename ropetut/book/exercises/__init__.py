"""Exercises for chapters 1 to 8, in the style of Triton-Puzzles: small kernels, and a
few PyTorch functions, that you finish yourself.

Each exercise is a starter with a marked gap (``# ---- exercise N.M ... ----``), which
as shipped computes something wrong, and a solution; a kernel comes with its launcher.
``check(name, fn)`` runs your kernel or function on small float32 inputs, against the
float64 reference, and prints PASS or FAIL with a hint. It runs wherever ropetut runs:
on a GPU, or on the CPU through Triton's interpreter. Chapters 1, 2 and 8 ask for
PyTorch functions; 3 to 7 for kernels.

- ``ch01`` ... ``ch08``: the starters (each chapter's exercise cells hold copies of
  them, for you to edit) and their launchers;
- ``solutions``: the solutions, one per starter, with the same names;
- ``check``: the check (``passes`` is the same, returning whether it passed), and
  ``EXERCISES``, every exercise by name.

>>> from ropetut.book.exercises import check, solutions
>>> check("ch03.interleaved", solutions.rope_interleaved)        # doctest: +SKIP
ch03.interleaved: PASS (2 cases: T=4, H=2, D=32; T=5, H=3, D=96)
"""

# sets TRITON_INTERPRET before any kernel below is defined
from ... import runtime  # noqa: F401
from . import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, solutions
from .ch04 import rotate_heads
from .check import EXERCISES, check, fn_name, passes

for _name, _starter in {
    "ch01.from_scratch": ch01.rope_from_scratch,
    "ch02.heads_first": ch02.rope_heads_first,
    "ch03.interleaved": ch03.rope_interleaved,
    "ch03.mask": ch03.rope_any_d,
    "ch04.half_split": ch04.rope_half_split,
    "ch04.fused_qk": ch04.rope_fused_qk,
    "ch05.backward": ch05.rope_fwd_bwd,
    "ch05.positions": ch05.rope_positions,
    "ch05.inplace": ch05.rope_inplace,
    "ch06.decode": ch06.rope_decode,
    "ch07.partial": ch07.rope_partial,
    "ch08.long_context": ch08.rope_long_context,
}.items():
    EXERCISES[_name].starter = _starter
    EXERCISES[_name].solution = getattr(solutions, fn_name(_starter))

__all__ = ["EXERCISES", "check", "passes", "rotate_heads", "solutions"]
