"""The seed author's training regime as runner options (issue 17, item 3; issue 27).

``--regime seed`` and its knobs: torch's Muon on the blocks' matrices with AdamW for
the rest, fp16 autocast with a GradScaler, dropout 0.1, 4 batches of 24 per step, 1,250
steps on the seed's schedule, and one overlapping split for every seed. On a CPU a run
is fp32 and the scaler scales and unscales exactly. The runs stored before these
options keep their configuration hashes.
"""

import functools
import json
import math

import pytest
import torch
from conftest import gpu_only, untimed

from ropetut.book.notebook import REPO
from ropetut.runtime import pick
from ropetut.training import train
from ropetut.training.model import GPTConfig

GPU_REGIME = "cuda, bf16 autocast, fused AdamW, deterministic"


def seed_regime(steps=6, **train_changes):
    """The tiny model in the seed's regime, on the seed's (fixed) overlapping split;
    the PyTorch rope, so that no Triton kernel is interpreted."""
    return train.configs(
        {"rope": "torch"},
        {"steps": steps, "eval_every": 3, "overlapping_split": True, **train_changes},
        seed=0,
        tiny=True,
        regime_name="seed",
    )


def test_the_stored_runs_keep_their_configs_and_hashes(monkeypatch):
    """Options at their defaults are left out of a stored config: every stored run's
    config reads back as itself, and the study's file names are the ones they were."""
    for path in sorted((REPO / "results" / "training_h100").glob("*.json")):
        record = json.loads(path.read_text())
        assert train.TrainConfig(**record["train"]).to_dict() == record["train"]
        assert GPTConfig(**record["model"]).to_dict() == record["model"]
    monkeypatch.setattr(train, "on_gpu", lambda: True)
    assert train.regime() == train.regime(train.TrainConfig()) == GPU_REGIME
    names = {
        (name, t.seed): train.run_file(".", name, m, t).name
        for name, m, t in train.study_plan("plot_twist")
    }
    assert names["NoPE", 0] == "NoPE__seed0__5f8826541f41.json"
    assert (
        names["seed baseline (3 confounds)", 0]
        == "seed_baseline__3_confounds__seed0__85a3f17a4c44.json"
    )


def test_the_seed_regime_is_the_seed_authors(monkeypatch):
    model_config, train_config = train.configs({}, {}, seed=3, regime_name="seed")
    assert model_config.dropout == 0.1
    assert (
        train_config.optimizer,
        train_config.autocast_dtype,
        train_config.grad_accumulation,
        train_config.batch_size,
        train_config.steps,
    ) == ("muon", "float16", 4, 24, 1250)
    # 5,000 batches, and the seed's schedule: warm-up over 250 steps, a cosine whose
    # horizon is 5,000 steps cut off at 1,250
    assert train.lr_at(249, train_config) == pytest.approx(1e-3)
    end = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 999 / 4750))
    assert train.lr_at(1249, train_config) == pytest.approx(1e-3 * end)
    assert train_config.to_dict()["schedule_steps"] == 5000
    # the split: the disjoint one draws nothing; the overlapping one is the seed's
    assert "split_seed" not in train_config.to_dict()
    for seed in (0, 1):
        _, overlapping = train.configs(
            {}, {"overlapping_split": True}, seed=seed, regime_name="seed"
        )
        assert overlapping.to_dict()["split_seed"] == 42
    monkeypatch.setattr(train, "on_gpu", lambda: True)
    assert train.regime(train_config) == (
        "cuda, fp16 autocast with a GradScaler, Muon and fused AdamW, deterministic"
    )


def test_a_run_in_another_regime_is_told_apart_by_its_options():
    default = train.configs({}, {}, seed=0, tiny=True)
    seed = train.configs({}, {}, seed=0, tiny=True, regime_name="seed")
    assert train.run_file(".", "x", *default) != train.run_file(".", "x", *seed)
    record = {"model": seed[0].to_dict(), "train": seed[1].to_dict()}
    said = train.differences({**record, "regime": train.regime()}, *default)
    assert "train.optimizer: 'muon' (wanted None)" in said
    assert "model.dropout: 0.1 (wanted 0.0)" in said


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model_config, train_config = seed_regime()
    model = train.TinyGPT(model_config)
    (muon, muon_lr), (adamw, adamw_lr) = train.make_optimizers(model, train_config)
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): name for name, p in model.named_parameters()}

    def taken(optimizer):
        return {names[id(p)] for g in optimizer.param_groups for p in g["params"]}

    assert taken(muon) == {
        "blocks.0.attn.wq.weight",
        "blocks.0.attn.wkv.weight",
        "blocks.0.attn.wo.weight",
        "blocks.0.ffn.0.weight",
        "blocks.0.ffn.3.weight",
    }
    assert taken(adamw) == set(names.values()) - taken(muon)  # the head is the embed
    assert "embed.weight" in taken(adamw) and "norm.weight" in taken(adamw)
    assert (muon_lr, adamw_lr) == (10, 1)
    assert muon.param_groups[0]["weight_decay"] == 0
    assert adamw.param_groups[0]["weight_decay"] == 0.1
    assert adamw.param_groups[0]["betas"] == (0.9, 0.999)


def test_k_accumulated_batches_train_as_one_batch_k_times_larger():
    def losses(batch_size, grad_accumulation):
        configs = train.configs(
            {"rope": "torch"},
            {
                "steps": 4,
                "batch_size": batch_size,
                "grad_accumulation": grad_accumulation,
            },
            seed=0,
            tiny=True,
        )
        record = train.train(*configs, progress=False)
        return record["train_loss"] + [record["final"]["loss"]]

    # fp32 on a CPU: equal but for summation order. A GPU trains under bf16 autocast and
    # cuBLAS picks other kernels for a batch of 2 than of 4: 1.1e-5 apart on the H200
    assert losses(2, 2) == pytest.approx(losses(4, 1), rel=pick(gpu=1e-4, cpu=1e-6))


@pytest.mark.parametrize(
    "autocast_dtype, scale", [("bfloat16", None), ("float16", 2**16)]
)
def test_float16_comes_with_a_grad_scaler(tmp_path, autocast_dtype, scale):
    checkpoint = tmp_path / "run.ckpt"
    train.train(
        *seed_regime(steps=1, autocast_dtype=autocast_dtype),
        progress=False,
        checkpoint=checkpoint,
        checkpoint_every=1,
    )
    state = torch.load(checkpoint, weights_only=True)["grad_scaler"]
    assert state.get("scale") == scale


def test_split_seed_draws_one_overlapping_split_for_every_seed(monkeypatch):
    drawn, real_make_split = [], train.make_split

    def make_split(*args, **options):
        drawn.append(options["seed"])
        return real_make_split(*args, **options)

    monkeypatch.setattr(train, "make_split", make_split)
    for split_seed in (None, 7):
        for seed in (0, 1):
            configs = train.configs(
                {"rope": "none"},
                {"steps": 1, "overlapping_split": True, "split_seed": split_seed},
                seed=seed,
                tiny=True,
            )
            train.train(*configs, progress=False)
    assert drawn == [0, 1, 7, 7]


def test_a_paused_seed_regime_run_resumes_exactly(tmp_path, monkeypatch):
    """Paused after every step, the run gives the uninterrupted record, and leaves the
    same optimizers' and GradScaler's states. The scaler grows every 2 steps here, so
    that its state changes (on a CPU its scaling is exact: losses cannot show it)."""
    grad_scaler = torch.amp.GradScaler
    monkeypatch.setattr(
        torch.amp, "GradScaler", functools.partial(grad_scaler, growth_interval=2)
    )
    configs = seed_regime(steps=6)
    whole = train.train(
        *configs, progress=False, checkpoint=tmp_path / "a.ckpt", checkpoint_every=6
    )
    pauses = 0
    while True:
        try:
            resumed = train.train(
                *configs,
                progress=False,
                checkpoint=tmp_path / "b.ckpt",
                checkpoint_every=6,
                stop_after=0,
                log=lambda _: None,
            )
            break
        except train.Paused:
            pauses += 1
    assert pauses == 5
    assert untimed(resumed) == untimed(whole)
    ends = [torch.load(tmp_path / f"{p}.ckpt", weights_only=True) for p in "ab"]
    assert ends[0]["grad_scaler"] == ends[1]["grad_scaler"]
    assert ends[0]["grad_scaler"]["scale"] == 2**16 * 2**3
    for mine, theirs in zip(ends[0]["optimizers"], ends[1]["optimizers"], strict=True):
        torch.testing.assert_close(mine["state"], theirs["state"], rtol=0, atol=0)


def plan_of(argv, monkeypatch, tmp_path) -> list:
    """The runs the command line would train."""
    planned = []
    monkeypatch.setattr(train, "run_all", lambda plan, *a, **k: planned.extend(plan))
    assert train.main([*argv, "--tiny", "--seeds", "0", "--out", str(tmp_path)]) == 0
    return planned


@pytest.mark.parametrize(
    "argv, model, trained",
    [
        (
            ["--regime", "seed"],
            {"dropout": 0.1},
            {"optimizer": "muon", "autocast_dtype": "float16", "grad_accumulation": 4},
        ),
        (
            ["--regime", "seed", "--optimizer", "adamw", "--dropout", "0"],
            {"dropout": 0.0},
            {"optimizer": "adamw", "autocast_dtype": "float16"},
        ),
        (["--optimizer", "muon"], {}, {"optimizer": "muon"}),
        (["--autocast-dtype", "float16"], {}, {"autocast_dtype": "float16"}),
        (["--grad-accumulation", "3"], {}, {"grad_accumulation": 3}),
        (["--schedule-steps", "50"], {}, {"schedule_steps": 50}),
        (["--dropout", "0.2"], {"dropout": 0.2}, {}),
        (["--overlapping-split", "--split-seed", "5"], {}, {"split_seed": 5}),
    ],
)
def test_each_option_reaches_the_configs(argv, model, trained, monkeypatch, tmp_path):
    ((name, model_config, train_config),) = plan_of(argv, monkeypatch, tmp_path)
    for key, value in model.items():
        assert getattr(model_config, key) == value
    for key, value in trained.items():
        assert getattr(train_config, key) == value
    assert all(flag.lstrip("-") in name for flag in argv if flag.startswith("--"))


def test_a_study_runs_in_the_seed_regime(monkeypatch, tmp_path):
    plan = plan_of(["--study", "plot_twist", "--regime", "seed"], monkeypatch, tmp_path)
    assert len(plan) == len(train.STUDIES["plot_twist"])
    assert {t.optimizer for _, _, t in plan} == {"muon"}
    assert {m.dropout for _, m, _ in plan} == {0.1}


def refuse_to_train(*args, **kwargs):
    raise AssertionError("trained before checking its arguments")


@pytest.mark.parametrize(
    "argv",
    [
        ["--regime", "fast"],
        ["--optimizer", "sgd"],
        ["--autocast-dtype", "float32"],
        ["--grad-accumulation", "0"],
        ["--schedule-steps", "0"],
        ["--dropout", "1"],
        ["--dropout", "-0.1"],
        ["--dropout", "nan"],
        ["--split-seed", "3"],
        ["--split-seed", "-1", "--overlapping-split"],
        ["--study", "plot_twist", "--optimizer", "muon"],
        ["--study", "plot_twist", "--grad-accumulation", "2"],
    ],
)
def test_bad_regime_options_are_refused_before_training(tmp_path, monkeypatch, argv):
    monkeypatch.setattr(train, "train", refuse_to_train)
    with pytest.raises(SystemExit) as refused:
        train.main([*argv, "--tiny", "--out", str(tmp_path)])
    assert refused.value.code == 2
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_trains_the_seed_regime(tmp_path):
    argv = ["--tiny", "--steps", "2", "--seeds", "0", "--rope", "torch"]
    assert train.main([*argv, "--regime", "seed", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json")
    record = train.read_run(path)
    assert path.name.startswith("rope_torch_regime_seed__seed0__")
    assert record["train"]["optimizer"] == "muon" and record["model"]["dropout"] == 0.1
    assert record["regime"] == train.regime(train.TrainConfig(**record["train"]))


@gpu_only
def test_a_paused_seed_regime_run_resumes_exactly_on_the_gpu(tmp_path):
    """The study's model in the seed's regime: fp16 autocast with a live GradScaler,
    Muon and fused AdamW, dropout; first, that two uninterrupted runs agree at all."""
    configs = train.configs(
        {}, {"steps": 6, "eval_every": 4}, seed=0, regime_name="seed"
    )
    first, again = (train.train(*configs, progress=False) for _ in range(2))
    assert untimed(first) == untimed(again), "the GPU run itself is not repeatable"
    pauses = 0
    while True:
        try:
            resumed = train.train(
                *configs,
                progress=False,
                checkpoint=tmp_path / "run.ckpt",
                checkpoint_every=2,
                stop_after=0,
                log=lambda _: None,
            )
            break
        except train.Paused:
            pauses += 1
    assert pauses == 5 and untimed(resumed) == untimed(first)
