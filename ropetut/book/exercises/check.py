"""The one check every exercise uses: your code against the float64 reference, PASS or
FAIL and why.

``check(name, fn)`` runs exercise ``name`` with ``fn`` on small float32 shapes (the last
one odd: D = 96, so D/2 is not a power of two) on ``ropetut.DEVICE``. ``fn`` is a kernel
(``@triton.jit``), which the exercise launches (on the CPU through Triton's interpreter,
or on the GPU), or, in the chapters before the kernels and where a chapter's lesson is
PyTorch, a plain PyTorch function, which it calls. Every tensor ``fn`` sees is a view
into a larger buffer:

- each row of D values is followed by D more, and the tensor by four times its size
  (the *guard*), so that a wrong mask, head count or stride lands there, not in unknown
  memory;
- outputs, guard included, start as NaN: an element the kernel never wrote stays NaN;
- inputs and their guard hold random numbers: reading the guard is harmless, writing it
  is not.

On failure it names the first case that failed and what went wrong: NaN (never
written), writes outside a tensor, an input overwritten, a known wrong answer (the input
unrotated, the other pairing, ...), or where the wrong elements are. The messages depend
on the shapes only, not on the device: a check prints the same text on the CPU and on a
GPU.
"""

import itertools
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...check import TOLERANCE, relative_error
from ...runtime import DEVICE
from ...tables import rope_tables, standard

TOL = TOLERANCE[torch.float32]
GUARD_ROWS = 4  # the guard after a tensor of n rows: 4 n + GUARD_ROWS rows
WIDTH = 88  # printed lines fit the book's column
AXES = ("t", "h", "d")  # exercise tensors are (T, H, D): one sequence


@dataclass
class Exercise:
    name: str
    run: Callable  # run(fn, lab, **case): launch or call fn, then lab.compare(...)
    cases: tuple  # shape kwargs; small, the last one odd
    starter: object = None  # the kernel or function as the chapter prints it (fails)
    solution: object = None  # in ropetut.book.exercises.solutions (passes)


EXERCISES: dict[str, Exercise] = {}


def fn_name(fn) -> str:
    """The name of a kernel (``@triton.jit`` wraps the function as ``.fn``) or a
    function."""
    return getattr(fn, "fn", fn).__name__


def exercise(name: str, cases):
    """Register ``run`` as exercise ``name``; starter and solution are attached in
    __init__."""

    def register(run):
        EXERCISES[name] = Exercise(name, run, tuple(cases))
        return run

    return register


@dataclass
class _Buffer:
    name: str
    backing: torch.Tensor  # the whole allocation, guard included
    inside: torch.Tensor  # bool mask over backing: the tensor the kernel was given
    before: torch.Tensor  # backing's values before the launch (CPU copy)
    is_input: bool
    may_change: bool  # an input the kernel is meant to overwrite (in place)


@dataclass
class Lab:
    """Makes one case's tensors on DEVICE, then judges what the kernel did to them."""

    seed: int = 0
    buffers: list = field(default_factory=list)
    views: dict = field(default_factory=dict)  # name -> the tensor the kernel was given
    problems: list = field(default_factory=list)
    # what the messages call the code checked: "the kernel" or "the function"
    who: str = "the kernel"

    def __post_init__(self):
        self.g = torch.Generator().manual_seed(self.seed)

    def _guarded(self, name, shape, *, is_input, may_change=False):
        n, *mid, D = shape
        backing = torch.full((1 + 5 * n + GUARD_ROWS, *mid, 2 * D), float("nan"))
        if is_input:
            backing.normal_(generator=self.g)
        inside = torch.zeros(backing.shape, dtype=torch.bool)
        inside[1 : n + 1, ..., :D] = True
        self.buffers.append(
            _Buffer(name, backing, inside, backing.clone(), is_input, may_change)
        )
        self.buffers[-1].backing = backing = backing.to(DEVICE)
        self.views[name] = backing[1 : n + 1, ..., :D]
        return self.views[name]

    def randn(self, name, *shape, may_change=False):
        """A float32 input of random values (never zeros: zeros hide unwritten
        outputs)."""
        return self._guarded(name, shape, is_input=True, may_change=may_change)

    def copy(self, name, src):
        """An input holding ``src``'s values, in the guarded layout."""
        view = self._guarded(name, tuple(src.shape), is_input=True)
        view.copy_(src)
        self.buffers[-1].before = self.buffers[-1].backing.cpu().clone()
        return view

    def empty(self, name, *shape):
        """A float32 output, NaN until the kernel writes it."""
        return self._guarded(name, shape, is_input=False)

    def tables(self, D, n_positions):
        return rope_tables(standard(D), n_positions, device=DEVICE)

    def positions(self, T, n_positions):
        return torch.randint(0, n_positions, (T,), generator=self.g).to(DEVICE)

    def compare(self, name, got, ref, wrong_answers=()):
        """``got`` against the float64 ``ref``; ``wrong_answers``: (what it means,
        tensor) pairs."""
        got = got.detach().double().cpu()
        # the reference computes on its input's device
        ref = ref.detach().double().cpu()
        nan = got.isnan()
        if nan.any():
            self.problems.append(
                f"{name}: {int(nan.sum())} of {nan.numel()} elements are NaN: "
                f"never written (outputs start as NaN), at {_where(nan)}"
            )
            return
        if relative_error(got, ref) <= TOL:
            return
        for meaning, alt in wrong_answers:
            if relative_error(got, alt) <= TOL:
                self.problems.append(f"{name}: {meaning}")
                return
        wrong = (got - ref).abs() > 1e-4 * ref.abs().max()
        self.problems.append(
            f"{name}: differs from the float64 reference (relative error "
            f"{relative_error(got, ref):.0e}, tolerance {TOL:.0e}), at {_where(wrong)}"
        )

    def check_buffers(self):
        for b in self.buffers:
            now = b.backing.detach().cpu()
            changed = ~((now == b.before) | (now.isnan() & b.before.isnan()))
            outside = int((changed & ~b.inside).sum())
            if outside:
                self.problems.insert(
                    0,
                    f"{b.name}: {outside} elements written outside the tensor "
                    "(past the end of a row, a head or the last token): a lane "
                    "that has no element to write must be masked off",
                )
            if b.is_input and not b.may_change and (changed & b.inside).any():
                self.problems.insert(
                    0,
                    f"{b.name}: {self.who} wrote into this input; it should "
                    "only read it",
                )


def _ranges(idx: list[int]) -> str:
    """[1, 3, 5, 7, 9] -> '1, 3, ..., 9'; [0, 1, 2, 5] -> '0..2, 5'."""
    steps = {b - a for a, b in itertools.pairwise(idx)}
    if len(idx) >= 4 and len(steps) == 1 and steps.pop() > 1:
        return f"{idx[0]}, {idx[1]}, ..., {idx[-1]}"
    out, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}..{a}")
            start = b
    return ", ".join(out)


def _where(mask: torch.Tensor) -> str:
    """Which indices along each axis hold a marked element:
    't 1..4, every h, d 0..15, 32..47'."""
    parts = []
    for axis, name in enumerate(AXES[-mask.dim() :]):
        others = [a for a in range(mask.dim()) if a != axis]
        hit = mask.any(dim=others[0], keepdim=True) if others else mask
        for a in others[1:]:
            hit = hit.any(dim=a, keepdim=True)
        idx = torch.nonzero(hit.flatten()).flatten().tolist()
        parts.append(
            f"every {name}"
            if len(idx) == mask.shape[axis]
            else f"{name} {_ranges(idx)}"
        )
    return ", ".join(parts)


def _label(case: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in case.items())


def _error_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def passes(name: str, fn, *, seed: int = 0) -> bool:
    """Run exercise ``name`` with ``fn`` (a ``@triton.jit`` kernel, or for some
    exercises a PyTorch function); print PASS or FAIL with a hint, and return whether
    it passed. ``seed`` draws the random inputs."""
    if name not in EXERCISES:
        raise KeyError(f"no exercise {name!r}; there are {sorted(EXERCISES)}")
    ex = EXERCISES[name]
    for n, case in enumerate(ex.cases):
        lab = Lab(
            seed=seed + n, who="the kernel" if hasattr(fn, "fn") else "the function"
        )
        try:
            ex.run(fn, lab, **case)
            lab.check_buffers()
        # a compile error, a bad launch, ...: the reader's to fix
        except Exception as e:  # noqa: BLE001
            lab.problems = [f"{lab.who} raised {_error_line(e)}"]
        if lab.problems:
            print(f"{name}: FAIL on {_label(case)}")
            for p in lab.problems:
                print(_wrapped(p, "  - ", "    "))
            return False
    cases = "; ".join(_label(c) for c in ex.cases)
    print(_wrapped(f"{name}: PASS ({len(ex.cases)} cases: {cases})", "", "  "))
    return True


def check(name: str, fn, *, seed: int = 0) -> None:
    """``passes`` for a notebook cell: it prints the verdict and returns nothing, so the
    cell shows no stray ``True``/``False`` (nbval runs cells outside IPython's history,
    where a trailing ``;`` does not hide a value)."""
    passes(name, fn, seed=seed)


def _wrapped(text: str, first: str, rest: str) -> str:
    """text in lines of at most WIDTH columns (the book's column), indented."""
    return textwrap.fill(
        text,
        WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
    )
