"""The study runner trusts nothing it did not write (issue 17, item 6).

Each test here is one defect the issue demonstrated on the runner before this fix.
"""

import json
import math
import os

import pytest

from ropetut.book.notebook import REPO
from ropetut.training import train

TWO = {"NoPE": (dict(rope="none"), {}), "RoPE": (dict(rope="final"), {})}


@pytest.fixture
def two(monkeypatch):
    monkeypatch.setitem(train.STUDIES, "two", TWO)
    return "two"


def study(out, seeds=(0,), steps=2, **options):
    return train.run_study(
        "two", out, seeds=seeds, tiny=True, steps=steps, progress=False, **options
    )


def test_a_result_file_carries_its_configuration_hash_in_it_and_in_its_name(
    tmp_path, two
):
    (path,) = study(tmp_path)[:1]
    record = json.loads(path.read_text())
    assert record["config_hash"] == train.config_hash(
        record["model"], record["train"], record["regime"]
    )
    assert record["config_hash"] in path.name


def test_resume_reruns_a_run_whose_configuration_differs_and_says_which(
    tmp_path, two, capsys
):
    study(tmp_path, steps=2)
    again = study(tmp_path, steps=3)  # the 2-step files must not stand for 3-step runs
    assert len(again) == 2
    assert all(json.loads(p.read_text())["train"]["steps"] == 3 for p in again)
    said = capsys.readouterr().out
    assert "steps" in said and "NoPE__seed0__" in said


def test_resume_skips_a_run_whose_file_it_verified(tmp_path, two):
    study(tmp_path)
    assert study(tmp_path) == []


def test_a_run_made_in_another_regime_is_rerun(tmp_path, two, monkeypatch, capsys):
    """A CPU run's file does not stand for the same configuration on a GPU (bf16
    autocast, fused AdamW), nor the other way round: the regime is in the hash."""
    here = train.regime()
    study(tmp_path)
    monkeypatch.setattr(train, "regime", lambda *_: "another regime than " + here)
    assert len(study(tmp_path)) == 2
    assert f"regime: {here!r}" in capsys.readouterr().out


def test_single_configurations_do_not_overwrite_each_other(tmp_path):
    common = ["--tiny", "--steps", "2", "--seeds", "0", "--out", str(tmp_path)]
    assert train.main(["--rope", "final", *common]) == 0
    assert train.main(["--rope", "final", "--base", "500", *common]) == 0
    bases = sorted(
        json.loads(p.read_text())["model"]["base"] for p in tmp_path.glob("*.json")
    )
    assert bases == [500.0, 10000.0]


@pytest.mark.parametrize("damage", ["truncated", "empty object", "not a run"])
def test_a_corrupt_file_is_named_and_rerun(tmp_path, two, capsys, damage):
    (path, _) = study(tmp_path)
    text = path.read_text()
    path.write_text(
        {
            "truncated": text[: len(text) // 2],
            "empty object": "{}",
            "not a run": "[1, 2]",
        }[damage]
    )
    with pytest.raises(ValueError, match=path.name):
        train.load_runs(tmp_path)
    assert study(tmp_path) == [path]
    assert path.name in capsys.readouterr().out
    assert len(train.load_runs(tmp_path)) == 2


def test_a_write_interrupted_before_its_rename_leaves_no_result(
    tmp_path, two, monkeypatch
):
    def crash(*args):
        raise OSError("killed between write and rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        study(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half written, no temporary left


def test_a_run_claimed_by_another_runner_is_left_to_it(tmp_path, two, capsys):
    model_config, train_config = train.configs(dict(rope="none"), {}, seed=0, tiny=True)
    train_config = train.replace(train_config, steps=2)
    path = train.run_file(tmp_path, "NoPE", model_config, train_config)
    with train.claim(path) as claimed:  # the other runner, working on NoPE seed 0
        assert claimed
        done = study(tmp_path)
    assert len(done) == 1 and done[0].name.startswith("RoPE__seed0__")
    assert f"{path.name} is claimed" in capsys.readouterr().out
    assert study(tmp_path) == [path]  # released: now this runner takes it


def test_the_same_seed_twice_is_refused(tmp_path, two):
    with pytest.raises(ValueError, match="seeds"):
        study(tmp_path, seeds=(0, 0))


def test_summary_refuses_to_average_different_configurations(tmp_path, two):
    study(tmp_path, steps=2)
    study(tmp_path, steps=3)
    with pytest.raises(ValueError, match="NoPE"):
        train.summarize(train.load_runs(tmp_path))


def refuse_to_train(*args, **kwargs):
    raise AssertionError("trained before checking its arguments")


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "0"],
        ["--steps", "-3"],
        ["--base", "0"],
        ["--base", "nan"],
        ["--base", "inf"],
        ["--base", "-10"],
        ["--rope", "v9"],
        ["--seeds", "0", "0"],
        ["--seeds", "-1"],
        ["--rope", "none", "--detach-rope"],
        ["--rope", "none", "--base", "500"],
        ["--rope", "none", "--preset", "standard"],
        ["--rope", "torch", "--preset", "standard"],
        ["--max-minutes", "5"],
        ["--max-minutes", "0", "--study", "plot_twist"],
        ["--checkpoint-every", "0"],
        ["--checkpoint-every", "-2"],
        ["--study", "plot_twist", "--rope", "torch"],
        ["--study", "plot_twist", "--overlapping-split"],
    ],
)
def test_bad_arguments_are_refused_before_training(tmp_path, monkeypatch, argv):
    monkeypatch.setattr(train, "train", refuse_to_train)
    with pytest.raises(SystemExit) as refused:
        train.main([*argv, "--tiny", "--out", str(tmp_path)])
    assert refused.value.code == 2
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_out_is_refused_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "train", refuse_to_train)
    blocker = tmp_path / "a file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as refused:
        train.main(["--tiny", "--steps", "2", "--out", str(blocker / "runs")])
    assert refused.value.code == 2 and "--out" in capsys.readouterr().err


def test_the_committed_study_still_loads_and_resumes_as_legacy(tmp_path, two):
    runs = train.load_runs(REPO / "results" / "training_h100")
    assert len(runs) == 39
    assert {row["seeds"] for row in train.summarize(runs)} == {3}
    assert all(math.isfinite(r["final"]["loss"]) for r in runs)
    # a legacy file (no hash in its name) recording this configuration is trusted
    (path, _) = study(tmp_path)
    legacy = path.with_name("NoPE__seed0.json")
    path.rename(legacy)
    assert study(tmp_path) == []


def test_a_lock_on_a_claim_file_deleted_meanwhile_claims_nothing(tmp_path, monkeypatch):
    """Runner B opens the claim file just before its holder deletes it and lets go: B's
    lock is then on a file no one else can see, and a third runner could claim the run
    too. B must see that and claim nothing."""
    path = tmp_path / "run.json"
    lock = train.fcntl.flock

    def flock_just_after_the_holder_let_go(handle, operation):
        (tmp_path / "run.json.claim").unlink()
        lock(handle, operation)

    monkeypatch.setattr(train.fcntl, "flock", flock_just_after_the_holder_let_go)
    with train.claim(path) as claimed:
        assert claimed is False
    monkeypatch.undo()
    with train.claim(path) as claimed:
        assert claimed is True
