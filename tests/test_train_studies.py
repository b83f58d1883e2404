"""Issue 27's studies, each one command: the seed's regime, the confounds, the budget;
the middle validation block, the timed steps, the committed margins."""

import json
import math

import pytest

from ropetut.book.notebook import REPO
from ropetut.training import data, stats, train

MARGINS = REPO / "results" / "training_h100_margins.json"


def resolved(study: str, name: str) -> dict:
    """A study configuration's model and training configs, as one flat dict."""
    model_config, train_config = train.configs(
        *train.STUDIES[study][name],
        seed=0,
        regime_name=train.STUDY_REGIMES.get(study, "default"),
    )
    return {**model_config.to_dict(), **train_config.to_dict()}


def differ(a: dict, b: dict) -> set:
    return {key for key in {*a, *b} if a.get(key) != b.get(key)}


def test_the_middle_block_validates_on_text_no_window_trains_on():
    n, seq_len = 10_000, 64
    end = data.make_split(n, seq_len)
    middle = data.make_split(n, seq_len, val_block="middle")
    assert len(middle.val_starts) == len(end.val_starts)
    assert middle.val_seen_fraction() == end.val_seen_fraction() == 0.0
    first, last = int(middle.val_starts[0]), int(middle.val_starts[-1]) + seq_len
    assert 0.4 * n < first and last < 0.6 * n
    inside = (middle.train_starts + seq_len >= first) & (middle.train_starts <= last)
    assert not inside.any()
    # the end block's split is the one the stored runs trained on
    n_train = round(0.9 * n)
    assert end.train_starts.tolist() == list(range(n_train - seq_len))
    with pytest.raises(ValueError, match="val_block"):
        data.make_split(n, seq_len, val_block="start")


def test_val_block_is_stored_only_where_it_moves_the_block():
    assert "val_block" not in train.TrainConfig().to_dict()
    assert train.TrainConfig(val_block="middle").to_dict()["val_block"] == "middle"
    with pytest.raises(ValueError, match="val_block"):
        train.TrainConfig(val_block="middle", overlapping_split=True)


def test_each_new_configuration_changes_one_thing_from_its_reference():
    fp32, fp16 = (
        resolved("confounds", f"torch baseline (seed math, {d}), fp16 scaled")
        for d in ("fp32", "fp16")
    )
    assert differ(fp32, fp16) == {"rope_dtype"}
    unscaled = resolved("plot_twist", "torch baseline (seed math, fp32)")
    assert differ(unscaled, fp32) == {"autocast_dtype"}
    for model in ("baseline", "triton"):
        end = resolved("plot_twist", f"seed {model}, disjoint split")
        assert differ(end, resolved("confounds", f"seed {model}, middle split")) == {
            "val_block"
        }
    for spectrum in ("RoPE base 10000", "half-truncated base 10000"):
        at_400 = resolved("plot_twist", spectrum)
        assert resolved("budget", spectrum) == at_400
        for steps in ("1,500", "5,000"):
            longer = resolved("budget", f"{spectrum}, {steps} steps")
            assert differ(at_400, longer) == {"steps"}
    v2, v4 = (
        resolved("seed_regime", f"seed regime: triton {v}, seed math (ch5)")
        for v in ("v2", "v4")
    )
    assert differ(v2, v4) == {"rope"}
    ch4 = resolved("seed_regime", "seed regime: triton v2 (ch4)")
    assert differ(ch4, v2) == {"preset", "negative_angle"}
    pytorch = resolved("seed_regime", "seed regime: pytorch (ch4, ch5)")
    assert differ(pytorch, resolved("plot_twist", "seed baseline (3 confounds)")) == {
        *("dropout", "optimizer", "autocast_dtype", "grad_accumulation"),
        *("batch_size", "steps", "warmup_steps", "schedule_steps", "split_seed"),
    }


def test_the_budget_shares_its_400_step_runs_with_plot_twist():
    def files(study):
        return {
            name: train.run_file(".", name, m, t).name
            for name, m, t in train.study_plan(study, seeds=(0,))
        }

    twist, budget = files("plot_twist"), files("budget")
    for name in ("RoPE base 10000", "half-truncated base 10000"):
        assert budget[name] == twist[name]


def test_a_study_shuffles_its_configurations_seed_by_seed():
    plan = train.study_plan("plot_twist", seeds=range(5))
    size = len(train.STUDIES["plot_twist"])
    blocks = [[name for name, _, _ in plan[i : i + size]] for i in range(0, 65, size)]
    assert all(sorted(block) == sorted(train.STUDIES["plot_twist"]) for block in blocks)
    assert len({tuple(block) for block in blocks}) == 5
    assert plan == train.study_plan("plot_twist", seeds=range(5))


@pytest.mark.parametrize("study", ["seed_regime", "confounds", "budget"])
def test_a_study_is_one_command_and_its_rerun_trains_nothing(
    study, tmp_path, monkeypatch, capsys
):
    argv = ["--study", study, "--tiny", "--steps", "2", "--seeds", "0"]
    assert train.main([*argv, "--out", str(tmp_path)]) == 0
    runs = train.load_runs(tmp_path)
    assert sorted(r["name"] for r in runs) == sorted(train.STUDIES[study])
    optimizers = {r["train"].get("optimizer", "adamw") for r in runs}
    assert optimizers == ({"muon"} if study == "seed_regime" else {"adamw"})
    capsys.readouterr()

    def refuse_to_train(*args, **kwargs):
        raise AssertionError("trained a run it had already written")

    monkeypatch.setattr(train, "train", refuse_to_train)
    assert train.main([*argv, "--out", str(tmp_path)]) == 0
    assert "not finished" not in capsys.readouterr().out


def test_a_study_with_its_own_regime_refuses_another(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        train.main(
            ["--study", "seed_regime", "--regime", "default", "--out", str(tmp_path)]
        )
    assert refused.value.code == 2 and "--regime" in capsys.readouterr().err


def test_timed_steps_leave_out_each_calls_warm_up(tmp_path, monkeypatch):
    configs = train.configs({}, {"steps": 6, "eval_every": 3}, seed=0, tiny=True)
    monkeypatch.setattr(train, "WARM_STEPS", 2)
    whole = train.train(*configs, progress=False)
    assert whole["timed_steps"] == 4
    assert 0 < whole["timed_seconds"] < whole["train_seconds"]
    # paused after every step, each call's one step is its warm-up: nothing is timed;
    # with no warm-up, every step is, the checkpoint carrying the count across calls
    for warm, timed in ((2, 0), (0, 6)):
        monkeypatch.setattr(train, "WARM_STEPS", warm)
        checkpoint = tmp_path / f"warm{warm}.ckpt"
        while True:
            try:
                record = train.train(
                    *configs,
                    progress=False,
                    checkpoint=checkpoint,
                    stop_after=0,
                    log=lambda _: None,
                )
                break
            except train.Paused:
                pass
        assert record["timed_steps"] == timed


def test_max_minutes_weighs_the_next_run_by_its_windows(tmp_path, monkeypatch):
    """After a 2-step run that took 2 s, a 100-step run is estimated at 100 s: it does
    not fit a minute, though the mean run so far (2 s) would."""
    clock = [0.0]
    monkeypatch.setattr(train.time, "perf_counter", lambda: clock[0])

    def one_second_a_step(model_config, train_config, **options):
        clock[0] += train_config.steps
        return {
            "name": options["name"],
            "model": model_config.to_dict(),
            "train": train_config.to_dict(),
            **dict.fromkeys(("split", "final"), {}),
            **dict.fromkeys(("train_seconds", "tokens_per_s"), 1.0),
        }

    monkeypatch.setattr(train, "train", one_second_a_step)
    plan = [
        (name, *train.configs({}, {"steps": steps}, seed=0, tiny=True))
        for name, steps in (("short", 2), ("long", 100))
    ]
    done = train.run_all(plan, tmp_path, max_minutes=1, progress=False, log=print)
    assert [path.name.split("__")[0] for path in done] == ["short"]


def test_the_committed_margins_name_study_runs_and_recompute_from_the_stored_runs():
    committed = json.loads(MARGINS.read_text())
    for name, margin in committed["margins"].items():
        assert math.isfinite(margin["margin"]) and margin["margin"] > 0, name
        assert margin["rationale"] and margin["unit"], name
    ids = [row["id"] for row in committed["comparisons"]]
    assert len(set(ids)) == len(ids)
    every = {name for study in train.STUDIES.values() for name in study}
    for row in committed["comparisons"]:
        # the study that trains its runs (one side may be another study's, in one --out)
        assert {row["a"], row["b"]} <= every, row["id"]
        assert {row["a"], row["b"]} & set(train.STUDIES[row["study"]]), row["id"]
        assert row["margin"] in committed["margins"], row["id"]
        assert row["measure"] in committed["rule"]["measures"], row["id"]
    loss = {}
    for run in train.load_runs(REPO / "results" / "training_h100"):
        loss.setdefault(run["name"], {})[run["train"]["seed"]] = run["final"]["loss"]
    for pair in committed["stored_spread"]["pairs"]:
        a, b = loss[pair["a"]], loss[pair["b"]]
        diffs = [b[seed] - a[seed] for seed in sorted(a)]
        mean = sum(diffs) / len(diffs)
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
        assert pair["paired_sd"] == round(sd, 4), pair
        assert pair["mean"] == round(stats.paired_difference(a, b)["mean"], 4), pair


@pytest.mark.parametrize(
    "b, word",
    [
        ({0: 1.001, 1: 2.0005, 2: 3.002}, "equivalent"),
        ({0: 1.1, 1: 2.11, 2: 3.12}, "higher"),
        ({0: 0.9, 1: 1.89, 2: 2.88}, "lower"),
        ({0: 1.05, 1: 1.95, 2: 3.01}, "inconclusive"),
    ],
)
def test_the_verdict_rule(b, word):
    a = {0: 1.0, 1: 2.0, 2: 3.0}
    result = stats.verdict(a, b, margin=0.01)
    assert result["verdict"] == word
    assert result["low"] <= result["mean"] <= result["high"]
