"""``ropetut/training/verdicts.py``: the committed margins' rule applied to runs."""

import importlib.util
import json
from pathlib import Path

import pytest

from ropetut.training import verdicts

REPO = Path(__file__).resolve().parents[1]


def run(name, seed, loss, device="GPU X", seconds=10.0, steps=400):
    return {
        "name": name,
        "model": {"d_model": 8},
        "train": {"seed": seed, "steps": steps},
        "final": {"loss": loss},
        "timed_seconds": seconds,
        "timed_steps": 100,
        "environment": {"device": device, "ropetut commit": "abc"},
    }


MARGINS = {
    "rule": {"alpha": 0.05},
    "margins": {"config": {"margin": 0.02}, "speed": {"margin": 0.02}},
    "comparisons": [
        {"id": "gap", "study": "s", "a": "A", "b": "B", "measure": "val_loss",
         "margin": "config", "seed_relative_gap": 0.5},
        {"id": "same", "study": "s", "a": "A", "b": "C", "measure": "val_loss",
         "margin": "config"},
        {"id": "speed", "study": "s", "a": "A", "b": "C",
         "measure": "log_seconds_per_step", "margin": "speed"},
        {"id": "unrun", "study": "s", "a": "A", "b": "D", "measure": "val_loss",
         "margin": "config"},
    ],
}  # fmt: skip


def study(noise=(0.001, -0.002, 0.0015, -0.001, 0.0005)):
    runs = []
    for seed, e in enumerate(noise):
        runs += [
            run("A", seed, 2.0 + e),
            run("B", seed, 3.0 + 2 * e),  # +50 %: the seed's gap, come back
            run("C", seed, 2.0 - e, seconds=5.0),  # same loss, half the time
        ]
    return runs


def test_each_comparison_gets_the_rules_verdict_and_unrun_ones_are_named():
    rows, missing = verdicts.comparison_verdicts(study(), MARGINS)
    got = {r["id"]: (r["verdict"], r["seeds"]) for r in rows}
    assert got == {
        "gap": ("higher", 5),
        "same": ("equivalent", 5),
        "speed": ("lower", 5),
    }
    assert missing == ["unrun"]
    gap = next(r for r in rows if r["id"] == "gap")
    assert gap["seed_gap"]["verdict"] == "come back"
    assert gap["seed_gap"]["ours"]["mean"] == pytest.approx(0.5, abs=2e-3)
    speed = next(r for r in rows if r["id"] == "speed")
    assert speed["mean"] == pytest.approx(-0.6931, abs=1e-4)  # log(1/2)


@pytest.mark.parametrize("seed_gap, word", [(0.2, "larger"), (2.0, "smaller")])
def test_the_seeds_gap_is_larger_or_smaller_outside_a_factor_of_two(seed_gap, word):
    margins = dict(MARGINS, comparisons=[
        dict(MARGINS["comparisons"][0], seed_relative_gap=seed_gap)
    ])  # fmt: skip
    rows, _ = verdicts.comparison_verdicts(study(), margins)
    assert rows[0]["seed_gap"]["verdict"] == word


def test_the_seeds_gap_of_the_other_sign_is_opposite_not_smaller():
    margins = dict(MARGINS, comparisons=[
        dict(MARGINS["comparisons"][0], seed_relative_gap=-0.5)
    ])  # fmt: skip
    rows, _ = verdicts.comparison_verdicts(study(), margins)
    assert rows[0]["seed_gap"]["verdict"] == "opposite sign"
    runs = [  # B now lower than A by half: the seed's -0.5 comes back
        dict(r, final={"loss": 1.0 + 0.5 * (r["final"]["loss"] - 3.0)})
        if r["name"] == "B" else r
        for r in study()
    ]  # fmt: skip
    rows, _ = verdicts.comparison_verdicts(runs, margins)
    assert rows[0]["seed_gap"]["verdict"] == "come back"


def test_a_comparison_whose_runs_come_from_two_devices_is_refused():
    runs = study()
    runs[0] = dict(runs[0], environment={"device": "GPU Y", "ropetut commit": "abc"})
    with pytest.raises(ValueError, match="'gap'.*devices"):
        verdicts.comparison_verdicts(runs, MARGINS)


def test_comparisons_on_different_devices_are_each_judged():
    """A study run on another GPU (the seed's regime, say) leaves the others be."""
    elsewhere = [dict(r, name="D", environment={"device": "GPU Y",
                                                "ropetut commit": "abc"})
                 for r in study() if r["name"] == "A"]  # fmt: skip
    margins = dict(MARGINS, comparisons=MARGINS["comparisons"] + [
        {"id": "d-only", "study": "s", "a": "D", "b": "D", "measure": "val_loss",
         "margin": "config"},
    ])  # fmt: skip
    margins["comparisons"] = [c for c in margins["comparisons"] if c["id"] != "unrun"]
    rows, missing = verdicts.comparison_verdicts(study() + elsewhere, margins)
    assert missing == []
    by_id = {r["id"]: r["device"] for r in rows}
    assert by_id == {"gap": "GPU X", "same": "GPU X", "speed": "GPU X",
                     "d-only": "GPU Y"}  # fmt: skip
    assert verdicts.devices(study() + elsewhere) == {None: ["GPU X", "GPU Y"]}


def test_a_seed_run_twice_is_refused():
    with pytest.raises(ValueError, match="seed 0 twice"):
        verdicts.comparison_verdicts(study() + [run("A", 0, 2.0)], MARGINS)


def test_a_name_with_runs_of_two_configurations_is_refused():
    runs = study()
    runs[0] = run("A", 0, 2.0, steps=100)
    with pytest.raises(ValueError, match="2 configurations"):
        verdicts.comparison_verdicts(runs, MARGINS)


def test_fewer_seeds_than_the_rule_asks_leave_a_comparison_waiting():
    """The rule: 5 seeds in the 400-step studies, 3 in the seed's regime."""
    three = study(noise=(0.001, -0.002, 0.0015))
    _, missing = verdicts.comparison_verdicts(three, MARGINS)
    assert missing == ["gap", "same", "speed", "unrun"]
    comparisons = [dict(c, study="seed_regime") for c in MARGINS["comparisons"]]
    seed_regime = dict(MARGINS, comparisons=comparisons)
    rows, missing = verdicts.comparison_verdicts(three, seed_regime)
    assert [r["id"] for r in rows] == ["gap", "same", "speed"]
    assert missing == ["unrun"]


def test_no_runs_leave_every_comparison_waiting():
    rows, missing = verdicts.comparison_verdicts([], MARGINS)
    assert rows == [] and missing == [c["id"] for c in MARGINS["comparisons"]]


def test_unequal_seeds_leave_a_comparison_waiting():
    runs = [r for r in study() if not (r["name"] == "B" and r["train"]["seed"] == 4)]
    _, missing = verdicts.comparison_verdicts(runs, MARGINS)
    assert "gap" in missing


def test_the_script_writes_the_table_of_the_committed_runs(tmp_path):
    """scripts/study_verdicts.py on the committed runs and margins: a row per
    comparison with runs, the rest named as waiting; the committed table is this one
    (rerun the script after adding runs)."""
    path = REPO / "scripts" / "study_verdicts.py"
    spec = importlib.util.spec_from_file_location("study_verdicts", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "verdicts.md"
    assert script.main(["--out", str(out)]) == 0
    text = out.read_text()
    margins = json.loads((REPO / "results/training_h100_margins.json").read_text())
    for c in margins["comparisons"]:
        assert f"`{c['id']}`" in text
    assert text == (REPO / "results/training_h100/study_verdicts.md").read_text()
