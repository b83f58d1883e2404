"""The study's verdicts: each comparison of the committed margins file, read from the
stored runs (issue 27, item 4).

``results/training_h100_margins.json`` lists the comparisons (configurations ``a`` and
``b`` of one study, a measure, a margin by name) and the rule, committed before the
study's first run. ``comparison_verdicts(runs, margins)`` applies that rule to every
comparison whose two configurations have runs: the paired interval and verdict of
``stats.verdict``, and for a comparison with the seed's own gap the unit-free one. A
comparison whose runs are missing, whose two configurations do not share their seeds,
or that has fewer seeds than the rule asks for its study (``MIN_SEEDS``), is left out:
``missing`` says which. A comparison's runs must share one device; two comparisons
need not (the seed's regime may run on another GPU). Nothing here trains.
"""

import math

from . import stats
from .train import unseeded_hash

# the rule's seeds: at least 5 in the 400-step regime's studies, 3 in the seed's regime
MIN_SEEDS = {"seed_regime": 3}
DEFAULT_MIN_SEEDS = 5

# the seed's gap counts as come back when our interval overlaps [gap / 2, 2 x gap]
SEED_GAP_FACTOR = 2.0


def value_of(run: dict, name: str) -> float:
    """A run's value of one of the margins file's measures."""
    if name == "val_loss":
        return run["final"]["loss"]
    if name == "log_seconds_per_step":
        return math.log(run["timed_seconds"] / run["timed_steps"])
    raise ValueError(f"measure: unknown {name!r}")


def by_seed(runs: list, name: str, measure_name: str) -> dict:
    """{seed: value} of configuration ``name``, from whichever study ran it (the
    confounds compare their runs with plot_twist's); ValueError if a seed repeats, or
    if the name's runs differ in more than their seed (a run with other steps, say)."""
    mine = [run for run in runs if run["name"] == name]
    unseeded = {unseeded_hash(r) for r in mine}
    if len(unseeded) > 1:
        raise ValueError(f"runs: {name!r} holds runs of {len(unseeded)} configurations")
    values = {}
    for run in mine:
        seed = run["train"]["seed"]
        if seed in values:
            raise ValueError(f"runs: {name!r} holds seed {seed} twice")
        values[seed] = value_of(run, measure_name)
    return values


def one_device(runs: list) -> str:
    """The GPU (or CPU) every run ran on; ValueError if they ran on more than one: a
    paired comparison across devices compares devices too."""
    devices = {run["environment"]["device"] for run in runs}
    if len(devices) != 1:
        raise ValueError(f"runs: from {len(devices)} devices, {sorted(devices)}")
    return devices.pop()


def devices(runs: list) -> dict:
    """{study: the sorted devices its runs ran on}: studies may run on different GPUs;
    each comparison checks its own runs (``comparison_verdicts``)."""
    found = {}
    for run in runs:
        found.setdefault(run.get("study"), set()).add(run["environment"]["device"])
    return {study: sorted(names) for study, names in found.items()}


def seed_gap(a: dict, b: dict, seed_relative_gap: float) -> dict:
    """The unit-free comparison with the seed: (b - a) / a seed by seed, its mean and
    95 % t interval, and where that interval lies against the seed's gap: "come back"
    (it overlaps [gap / 2, 2 x gap]), "smaller" or "larger" (wholly below or above that
    band, on the seed's side of 0), or "opposite sign" (wholly on the other side of
    0)."""
    gaps = {seed: (b[seed] - a[seed]) / a[seed] for seed in a}
    zeros = dict.fromkeys(gaps, 0.0)
    interval = stats.paired_difference(zeros, gaps)
    low, high = seed_relative_gap / SEED_GAP_FACTOR, seed_relative_gap * SEED_GAP_FACTOR
    if seed_relative_gap < 0:  # the band [2 x gap, gap / 2] of a negative gap
        low, high = high, low
    if (seed_relative_gap > 0 and interval["high"] < 0) or (
        seed_relative_gap < 0 and interval["low"] > 0
    ):
        word = "opposite sign"
    elif interval["high"] < low:
        word = "smaller"
    elif interval["low"] > high:
        word = "larger"
    else:
        word = "come back"
    return {"seed": seed_relative_gap, "ours": interval, "verdict": word}


def comparison_verdicts(runs: list, margins: dict) -> tuple[list, list]:
    """(rows, missing): a row per comparison with runs of both configurations on the
    same seeds, at least its study's ``MIN_SEEDS``, in the margins file's order; the
    ids of the others. Each comparison's runs must come from one device (ValueError
    if not), which the row names; other comparisons may use another."""
    rows, missing = [], []
    alpha = margins["rule"]["alpha"]
    for c in margins["comparisons"]:
        a = by_seed(runs, c["a"], c["measure"])
        b = by_seed(runs, c["b"], c["measure"])
        enough = MIN_SEEDS.get(c["study"], DEFAULT_MIN_SEEDS)
        if a.keys() != b.keys() or len(a) < enough:
            missing.append(c["id"])
            continue
        mine = [r for r in runs if r["name"] in (c["a"], c["b"])]
        try:
            device = one_device(mine)
        except ValueError as error:
            raise ValueError(f"comparison {c['id']!r}: {error}") from None
        margin = margins["margins"][c["margin"]]["margin"]
        row = dict(c, seeds=len(a), device=device)
        row.update(stats.verdict(a, b, margin, alpha))
        if "seed_relative_gap" in c:
            row["seed_gap"] = seed_gap(a, b, c["seed_relative_gap"])
        rows.append(row)
    return rows, missing
