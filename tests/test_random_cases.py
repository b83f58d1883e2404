"""scripts/random_cases.py: a few random cases pass on the CPU, and the checker counts a
wrong entry point wrong (a slightly wrong output, an unwritten element, a missing
gradient, an output left unrotated)."""

import importlib.util
from pathlib import Path

import pytest
import torch

import ropetut
import ropetut.hf
from ropetut.check import TOLERANCE

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "random_cases.py"
spec = importlib.util.spec_from_file_location("random_cases", SCRIPT)
random_cases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(random_cases)


def run(capsys, *argv):
    """main's exit status, {entry point: (cases, wrong)} from its lines, its output."""
    status = random_cases.main(["--cases", "2", *argv])
    out = capsys.readouterr().out
    counts = {}
    for line in out.splitlines():
        entry, *words = line.split()
        if entry in random_cases.ENTRY_POINTS and words[1:4:2] == ["cases", "wrong"]:
            counts[entry] = (int(words[0]), int(words[2]))
    return status, counts, out


def test_a_few_cases_pass(capsys):
    status, counts, out = run(capsys)
    assert "torch" in out and "triton" in out
    assert counts == {entry: (2, 0) for entry in random_cases.ENTRY_POINTS}, out
    assert status == 0 and "random cases: 0 wrong" in out


def slightly_wrong_thd(*args, **kwargs):
    """Ten tolerances off."""
    q_out, k_out = ORIGINAL["apply_rope_thd"](*args, **kwargs)
    return q_out * (1 + 10 * TOLERANCE[q_out.dtype]), k_out


def unwritten_element_angles(*args, **kwargs):
    """k_out's last element left NaN, as a kernel that forgot it leaves the poison."""
    q_out, k_out = ORIGINAL["apply_rope_angles"](*args, **kwargs)
    last = torch.zeros(k_out.numel(), dtype=torch.bool)
    last[-1] = True
    return q_out, k_out.masked_fill(last.view(k_out.shape).to(k_out.device), NAN)


def no_w_k_gradient(q, k, w_q, w_k, *args, **kwargs):
    """Right forward, but no gradient reaches w_k."""
    return ORIGINAL["apply_qk_norm_rope"](q, k, w_q, w_k.detach(), *args, **kwargs)


def unrotated_k(q, k, cos, sin, **kwargs):
    q_out, _ = ORIGINAL["hf.apply_rotary_pos_emb"](q, k, cos, sin, **kwargs)
    return q_out, k * 1


NAN = float("nan")
ORIGINAL = {
    "apply_rope_thd": ropetut.apply_rope_thd,
    "apply_rope_angles": ropetut.apply_rope_angles,
    "apply_qk_norm_rope": ropetut.apply_qk_norm_rope,
    "hf.apply_rotary_pos_emb": ropetut.hf.apply_rotary_pos_emb,
}
FAULTS = {
    "apply_rope_thd": slightly_wrong_thd,
    "apply_rope_angles": unwritten_element_angles,
    "apply_qk_norm_rope": no_w_k_gradient,
    "hf.apply_rotary_pos_emb": unrotated_k,
}


@pytest.mark.parametrize("entry", FAULTS)
def test_a_wrong_entry_point_is_counted_wrong(entry, monkeypatch, capsys):
    module = ropetut.hf if entry.startswith("hf.") else ropetut
    monkeypatch.setattr(module, entry.removeprefix("hf."), FAULTS[entry])
    status, counts, out = run(capsys, "--only", entry)
    assert counts == {entry: (2, 2)}, out
    assert status == 1 and "random cases: 2 wrong" in out
    assert out.count(f"wrong: {entry} case") == 2
