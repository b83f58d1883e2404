"""Training: the learning-rate schedule, one tiny run end to end, and a study that resumes."""
import json

import pytest

from ropetut.training import train
from ropetut.training.model import GPTConfig


def test_lr_schedule_warms_up_then_decays_to_its_floor():
    config = train.TrainConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_fraction=0.1)
    assert train.lr_at(0, config) == pytest.approx(1e-4)
    assert train.lr_at(9, config) == pytest.approx(1e-3)
    assert train.lr_at(99, config) == pytest.approx(1e-4, rel=1e-2)
    lrs = [train.lr_at(s, config) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_tiny_run_learns_and_records_everything():
    model_config, train_config = train.configs({}, dict(steps=12), seed=0, tiny=True)
    record = train.train(model_config, train_config, progress=False, name="tiny")
    assert record["train_loss"][-1] < record["train_loss"][0]
    assert len(record["train_loss"]) == 12 and record["val_curve"][-1]["step"] == 12
    final = record["final"]
    assert 0 <= final["accuracy"] <= 1 and final["perplexity"] == pytest.approx(2.718281828 ** final["loss"])
    assert record["corpus"]["sha256"] and record["tokens_per_s"] > 0
    assert record["split"] == {**record["split"], "mode": "disjoint", "val_seen_fraction": 0.0}
    assert record["model"]["rope"] == "final" and record["environment"]["mode"]
    json.dumps(record)                                 # everything in it is JSON


def test_seed_makes_runs_repeatable():
    a = train.train(*train.configs({}, dict(steps=3), seed=1, tiny=True), progress=False)
    b = train.train(*train.configs({}, dict(steps=3), seed=1, tiny=True), progress=False)
    assert a["train_loss"] == b["train_loss"] and a["final"] == b["final"]


def test_study_configurations_change_one_thing_from_their_reference():
    """Each confound is isolated: a run differs from its three-confound run in one switch only."""
    study = train.STUDIES["plot_twist"]

    def resolved(name):
        model_changes, train_changes = study[name]
        model_config, train_config = train.configs(model_changes, train_changes, seed=0)
        return {**model_config.to_dict(), "overlapping_split": train_config.overlapping_split}

    def differ(a, b):
        return {k for k in a if a[k] != b[k]}

    base, triton = resolved("seed baseline (3 confounds)"), resolved("seed triton (3 confounds)")
    assert differ(base, resolved("seed baseline, by position")) == {"rotate_by_head_index"}
    assert differ(base, resolved("seed baseline, disjoint split")) == {"overlapping_split"}
    assert differ(triton, resolved("seed triton, with gradient")) == {"detach_rope"}
    assert differ(triton, resolved("seed triton, disjoint split")) == {"overlapping_split"}
    assert differ(resolved("torch baseline (seed math, fp32)"),
                  resolved("torch baseline (seed math, fp16)")) == {"rope_dtype"}
    assert differ(resolved("half-truncated base 10000"), resolved("half-truncated base 1024")) == {"base"}
    assert differ(resolved("torch baseline (seed math, fp32)"), resolved("triton final (seed math)")) == {"rope"}
    assert GPTConfig(**{k: v for k, v in base.items() if k != "overlapping_split"}).rope == "torch"


def test_study_writes_a_file_per_run_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setitem(train.STUDIES, "two", {"NoPE": (dict(rope="none"), {}),
                                               "RoPE": (dict(rope="final"), {})})
    first = train.run_study("two", tmp_path, seeds=(0,), tiny=True, steps=2, progress=False)
    assert sorted(p.name.split("__")[:2] for p in first) == [["NoPE", "seed0"], ["RoPE", "seed0"]]
    again = train.run_study("two", tmp_path, seeds=(0, 1), tiny=True, steps=2, progress=False)
    assert sorted(p.name.split("__")[:2] for p in again) == [["NoPE", "seed1"], ["RoPE", "seed1"]]
    rows = train.summarize(train.load_runs(tmp_path))
    assert [(r["name"], r["seeds"]) for r in rows] == [("NoPE", 2), ("RoPE", 2)]
    assert "NoPE" in train.format_summary(rows)


def test_deterministic_on_gpu_sets_and_restores(monkeypatch):
    """The GPU regime's settings hold inside train and come back after, an error
    included (on the CPU the context does nothing: torch's CPU kernels are repeatable)."""
    import os

    import torch

    monkeypatch.setattr(train, "on_gpu", lambda: True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    with pytest.raises(KeyError), train.deterministic_on_gpu():
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.utils.deterministic.fill_uninitialized_memory
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        raise KeyError("mid-run")
    assert torch.are_deterministic_algorithms_enabled() == before
    assert torch.utils.deterministic.fill_uninitialized_memory
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
