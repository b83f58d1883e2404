"""A run resumes inside itself, exactly (issue 17, item 3: a device call lasts at most
10 minutes, a run may last longer).

A run stopped and resumed from its checkpoint gives the record of the run that never
stopped, bit for bit: the same losses, evaluation points and final numbers. Only the
time it took (``train_seconds``, ``timed_seconds``, ``timed_steps``, ``tokens_per_s``)
and the peak memory (that of the last part) may differ. The tiny model has dropout
here, so that the RNG states matter, and evaluates every 3 steps, so that
evaluation points fall between checkpoints.
"""

import json
import os

import pytest
import torch

from ropetut.training import train
from ropetut.training.checkpoint import Paused, read_checkpoint, write_checkpoint

from conftest import gpu_only, untimed

TWO = {"NoPE": (dict(rope="none"), {}), "RoPE": (dict(rope="final"), {})}


def tiny(steps=8, **train_changes):
    return train.configs(
        dict(dropout=0.1),
        dict(steps=steps, eval_every=3, **train_changes),
        seed=0,
        tiny=True,
    )


def digest(model_config, train_config) -> str:
    return train.config_hash(
        model_config.to_dict(), train_config.to_dict(), train.regime(train_config)
    )


def resume_until_done(configs, checkpoint, **options) -> tuple[dict, int]:
    """The run's record, calling ``train`` again after each pause; and the pauses."""
    pauses = 0
    while True:
        try:
            record = train.train(
                *configs, progress=False, checkpoint=checkpoint, **options
            )
            return record, pauses
        except Paused:
            pauses += 1
            assert pauses < 100, "the run does not progress"


@pytest.fixture(scope="module")
def uninterrupted():
    return train.train(*tiny(), progress=False)


def test_a_run_paused_after_every_step_gives_the_uninterrupted_record(
    tmp_path, uninterrupted
):
    resumed, pauses = resume_until_done(
        tiny(), tmp_path / "run.json.ckpt", stop_after=0, log=lambda _: None
    )
    assert pauses == 7  # after each step but the last
    assert resumed["train_loss"] == uninterrupted["train_loss"]
    assert resumed["val_curve"] == uninterrupted["val_curve"]
    assert resumed["final"] == uninterrupted["final"]
    assert untimed(resumed) == untimed(uninterrupted)
    assert resumed["train_seconds"] > 0


def test_a_run_killed_after_5_steps_resumes_from_its_step_4_checkpoint(
    tmp_path, uninterrupted, monkeypatch
):
    checkpoint = tmp_path / "run.json.ckpt"
    lr_at = train.lr_at

    def killed_at_step_5(step, config):
        if step == 5:
            raise KeyboardInterrupt("killed")
        return lr_at(step, config)

    monkeypatch.setattr(train, "lr_at", killed_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train.train(*tiny(), progress=False, checkpoint=checkpoint, checkpoint_every=2)
    monkeypatch.undo()
    state = read_checkpoint(checkpoint, digest(*tiny()))
    assert state["step"] == 4 and len(state["train_loss"]) == 4
    assert [point["step"] for point in state["val_curve"]] == [3]
    said = []
    resumed = train.train(
        *tiny(),
        progress=False,
        checkpoint=checkpoint,
        checkpoint_every=2,
        log=said.append,
    )
    assert said == ["run resumes at step 4 of 8"]
    assert untimed(resumed) == untimed(uninterrupted)


def test_a_checkpoint_of_another_configuration_is_refused_and_the_run_starts_over(
    tmp_path,
):
    checkpoint = tmp_path / "run.json.ckpt"
    with pytest.raises(Paused):
        train.train(*tiny(), progress=False, checkpoint=checkpoint, stop_after=0)
    other = tiny(lr=2e-3)
    with pytest.raises(ValueError, match=f"{checkpoint}.*{digest(*tiny())}"):
        read_checkpoint(checkpoint, digest(*other))
    said = []
    record = train.train(*other, progress=False, checkpoint=checkpoint, log=said.append)
    assert len(said) == 1 and "starts over" in said[0] and str(checkpoint) in said[0]
    assert untimed(record) == untimed(train.train(*other, progress=False))


@pytest.mark.parametrize(
    "damage", ["truncated", "empty", "not a checkpoint", "a part missing"]
)
def test_a_corrupt_checkpoint_is_named_and_the_run_starts_over(
    tmp_path, uninterrupted, damage
):
    checkpoint = tmp_path / "run.json.ckpt"
    with pytest.raises(Paused):
        train.train(*tiny(), progress=False, checkpoint=checkpoint, stop_after=0)
    whole = checkpoint.read_bytes()
    if damage == "truncated":
        checkpoint.write_bytes(whole[: len(whole) // 2])
    elif damage == "empty":
        checkpoint.write_bytes(b"")
    elif damage == "not a checkpoint":
        torch.save([1, 2], checkpoint)
    else:
        state = torch.load(checkpoint, weights_only=True)
        del state["batch_rng"]
        torch.save(state, checkpoint)
    with pytest.raises(ValueError, match=checkpoint.name):
        read_checkpoint(checkpoint, digest(*tiny()))
    said = []
    record = train.train(
        *tiny(), progress=False, checkpoint=checkpoint, log=said.append
    )
    assert len(said) == 1 and str(checkpoint) in said[0] and "starts over" in said[0]
    assert untimed(record) == untimed(uninterrupted)


def test_a_checkpoint_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    checkpoint = tmp_path / "run.json.ckpt"

    def crash(*args):
        raise OSError("killed between write and rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        train.train(*tiny(), progress=False, checkpoint=checkpoint, checkpoint_every=1)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="state"):
        write_checkpoint(checkpoint, {"step": 1})


@pytest.mark.parametrize(
    "options, words",
    [
        (dict(checkpoint_every=2), "checkpoint"),
        (dict(stop_after=10.0), "checkpoint"),
        (dict(checkpoint="x.ckpt", checkpoint_every=0), "checkpoint_every"),
        (dict(checkpoint="x.ckpt", stop_after=-1.0), "stop_after"),
        (dict(checkpoint="x.ckpt", stop_after=float("nan")), "stop_after"),
    ],
)
def test_bad_checkpoint_arguments_are_refused_before_training(
    tmp_path, monkeypatch, options, words
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "TinyGPT", None)  # building a model would fail
    with pytest.raises(ValueError, match=words):
        train.train(*tiny(), progress=False, **options)
    assert list(tmp_path.iterdir()) == []


def test_a_study_spread_over_many_calls_gives_the_uninterrupted_study(
    tmp_path, monkeypatch, capsys
):
    """Each call's time is up after one step: a call pauses the run in progress, the
    next resumes it; a run's checkpoint goes once its file is written."""
    monkeypatch.setitem(train.STUDIES, "two", TWO)

    def study(out, **options):
        return train.run_study(
            "two", out, seeds=(0,), tiny=True, steps=3, progress=False, **options
        )

    whole = {p.name: json.loads(p.read_text()) for p in study(tmp_path / "whole")}
    real_train = train.train

    def out_of_time_after_a_step(*args, stop_after=None, **options):
        assert stop_after is not None and stop_after > 0
        return real_train(*args, stop_after=0, **options)

    monkeypatch.setattr(train, "train", out_of_time_after_a_step)
    parts, calls = tmp_path / "parts", 0
    while len(list(parts.glob("*.json"))) < 2:
        study(parts, max_minutes=60, checkpoint_every=2)
        calls += 1
        assert calls < 10, "the study does not progress"
    assert calls == 5  # NoPE: paused at 1, 2, done at 3; RoPE: the same
    said = capsys.readouterr().out
    assert "paused at step 2 of 3" in said and "RoPE resumes at step 2 of 3" in said
    assert sorted(p.name for p in parts.iterdir()) == sorted(whole)
    for name, record in whole.items():
        assert untimed(json.loads((parts / name).read_text())) == untimed(record)
    monkeypatch.setattr(train, "train", real_train)
    assert study(parts, checkpoint_every=2) == []


def test_the_command_line_checkpoints_and_leaves_no_checkpoint_behind(
    tmp_path, monkeypatch
):
    real_train, asked = train.train, []

    def spy(*args, **options):
        asked.append(options["checkpoint_every"])
        return real_train(*args, **options)

    monkeypatch.setattr(train, "train", spy)
    argv = ["--tiny", "--steps", "2", "--seeds", "0", "--checkpoint-every", "1"]
    assert train.main([*argv, "--out", str(tmp_path)]) == 0
    assert asked == [1]
    assert [p.suffix for p in tmp_path.iterdir()] == [".json"]


@gpu_only
def test_a_paused_run_resumes_exactly_on_the_gpu(tmp_path):
    """The study's model in the GPU regime (bf16 autocast, fused AdamW, CUDA's RNG for
    dropout); first, that two uninterrupted runs agree at all."""
    configs = train.configs(
        dict(dropout=0.1), dict(steps=6, eval_every=4, final_eval_windows=16), seed=0
    )
    first, again = (train.train(*configs, progress=False) for _ in range(2))
    assert untimed(first) == untimed(again), "the GPU run itself is not repeatable"
    resumed, pauses = resume_until_done(
        configs,
        tmp_path / "run.json.ckpt",
        checkpoint_every=2,
        stop_after=0,
        log=lambda _: None,
    )
    assert pauses == 5
    assert untimed(resumed) == untimed(first)
