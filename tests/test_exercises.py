"""The exercises of chapters 1-8: every solution passes its check, every starter fails it with
the hint the chapter shows, and each chapter's editable cell is the starter tested here."""
import inspect
import json
from pathlib import Path

import pytest
import torch

import ropetut
from ropetut.book.exercises import EXERCISES, check, passes
from ropetut.book.exercises.check import Lab, fn_name

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = {
    "ch01": "01_rope_from_scratch",
    "ch02": "02_pytorch_baseline",
    "ch03": "03_triton_v1",
    "ch04": "04_triton_v2_v3_v4",
    "ch05": "05_autograd_and_fusion",
    "ch06": "06_from_kernel_to_model",
    "ch07": "07_the_frequency_bug",
    "ch08": "08_precision",
}

# What the check must say about each starter as shipped: the hint, not only "FAIL".
STARTER_HINTS = {
    "ch01.from_scratch": "nothing was rotated",
    "ch02.heads_first": "by the angle of position h: the seed's NoPE bug",
    "ch03.interleaved": "nothing was rotated",
    "ch03.mask": "written outside the tensor",
    "ch04.half_split": "is interleaved RoPE",
    "ch04.fused_qk": "k_out: 256 of 256 elements are NaN",
    "ch05.backward": "the backward turns by -theta",
    "ch05.positions": "ignores `positions`",
    "ch05.inplace": "load every input before you store over it",
    "ch06.decode": "t 1, 3 sit outside the table (positions 11, -1): they must come out NaN",
    "ch07.partial": "d 16..31 were never written (NaN): out of place, copy",
    "ch08.long_context": "angles rounded to float32",
}


def test_every_exercise_is_tested_and_complete():
    assert set(EXERCISES) == set(STARTER_HINTS)
    for name, ex in EXERCISES.items():
        assert ex.starter is not None and ex.solution is not None, name
        assert fn_name(ex.starter) == fn_name(ex.solution), name
        assert any(c.get("D", 0) // 2 & (c.get("D", 0) // 2 - 1) for c in ex.cases), \
            f"{name}: no case with D/2 not a power of two"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_solution_passes(name, seed, capsys):
    assert passes(name, EXERCISES[name].solution, seed=seed)
    assert capsys.readouterr().out.startswith(f"{name}: PASS")


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_starter_fails_with_its_hint(name, capsys):
    assert not passes(name, EXERCISES[name].starter)
    out = capsys.readouterr().out
    assert out.startswith(f"{name}: FAIL on "), out
    assert STARTER_HINTS[name] in " ".join(out.split()), out  # (wrapped to the column)
    assert max(map(len, out.splitlines())) <= 88, out


def test_check_shows_only_the_verdict(capsys):
    """A chapter's check cell shows the verdict and no stray False: nbval runs cells outside
    IPython's history, where a trailing ';' does not hide a returned value."""
    assert check("ch03.interleaved", EXERCISES["ch03.interleaved"].starter) is None
    assert capsys.readouterr().out.startswith("ch03.interleaved: FAIL on ")


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_chapter_cell_is_the_starter(name):
    """The chapter's editable cell holds the starter verbatim, so 'the starter fails' above is
    a statement about what the reader gets; and its check cell checks that kernel."""
    chapter, starter = CHAPTERS[name.split(".")[0]], EXERCISES[name].starter
    nb = json.loads((ROOT / "chapters" / f"{chapter}.ipynb").read_text(encoding="utf-8"))
    sources = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    call = f'check("{name}", {fn_name(starter)})'
    source = inspect.getsource(getattr(starter, "fn", starter))  # a kernel, or a function
    assert source.strip() in [s.strip() for s in sources], \
        f"{chapter} has no cell equal to the starter {fn_name(starter)}"
    assert any(call in s for s in sources), f"{chapter} has no check cell for {name}"


def _pairs_at_one_radian(x, base=10000.0):
    """Exercise 1.1 half done: the rotation written, every omega_i left at 1."""
    p = torch.arange(x.shape[0], dtype=torch.float64, device=x.device)[:, None, None]
    x1, x2 = x.double().chunk(2, dim=-1)
    return torch.cat([x1 * p.cos() - x2 * p.sin(), x2 * p.cos() + x1 * p.sin()], -1)


def _tables_left_in_float64(x, positions, freqs):
    """Exercise 8.1 half done: float64 angles, but cos and sin never rounded to float32."""
    angle = positions.double()[:, None, None] * freqs.double()
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(),
                      x2 * angle.cos() + x1 * angle.sin()], -1)


@pytest.mark.parametrize("name, fn, hint", [
    ("ch01.from_scratch", _pairs_at_one_radian, "turns every pair at 1 radian per position"),
    ("ch08.long_context", _tables_left_in_float64, "is torch.float64, x is torch.float32"),
])
def test_half_done_function_gets_its_hint(name, fn, hint, capsys):
    """A PyTorch exercise checks a plain function the way it checks a kernel."""
    assert not passes(name, fn)
    assert hint in capsys.readouterr().out


def test_lab_guard_sees_writes_outside_and_unwritten_elements():
    lab = Lab()
    out = lab.empty("out", 2, 3, 4)
    out.fill_(1.0)
    lab.buffers[0].backing[1, 0, 4] = 2.0            # one element past the end of a row
    lab.check_buffers()
    assert lab.problems and "1 elements written outside" in lab.problems[0]
    lab = Lab()
    out = lab.empty("out", 2, 3, 4)
    out[:, :, :2] = 0.0
    lab.compare("out", out, torch.zeros(2, 3, 4, dtype=torch.float64))
    assert lab.problems == ["out: 12 of 24 elements are NaN: never written (outputs start as NaN), "
                            "at every t, every h, d 2..3"]


def test_lab_names_an_answer_wrong_in_no_listed_way():
    """Twice the reference matches no listed wrong answer: the lab says where it differs,
    with the reference on the device the kernels use (it computes on its input's)."""
    lab = Lab()
    ref = torch.randn(2, 3, 4, dtype=torch.float64, device=ropetut.DEVICE)
    out = lab.empty("out", 2, 3, 4)
    out.copy_(2 * ref)
    lab.compare("out", out, ref, [("the turn goes the other way", -ref)])
    assert len(lab.problems) == 1
    assert lab.problems[0].startswith("out: differs from the float64 reference")
