"""Paired statistics: Student's t, the paired interval and TOST (issue 17, item 2)."""

import math

import pytest

from ropetut.training import stats

# Student's t quantiles from published tables (scipy.stats.t.ppf's values)
T_975 = {
    1: 12.706204736174698,
    2: 4.302652729911275,
    4: 2.7764451051977987,
    10: 2.2281388519649385,
    30: 2.0422724563012373,
}


@pytest.mark.parametrize("df", sorted(T_975))
def test_t_quantile_matches_the_tables(df):
    assert stats.t_quantile(0.975, df) == pytest.approx(T_975[df], rel=1e-9)
    assert stats.t_cdf(T_975[df], df) == pytest.approx(0.975, abs=1e-10)
    assert stats.t_cdf(-T_975[df], df) == pytest.approx(0.025, abs=1e-10)
    assert stats.t_cdf(0.0, df) == pytest.approx(0.5, abs=1e-15)


def test_paired_difference_is_the_t_interval_of_the_per_seed_differences():
    # chapter 09's triton final minus torch baseline (seed math), seeds 0, 1, 2
    torch_loss = {0: 1.9000, 1: 1.8000, 2: 1.8500}
    triton_loss = {0: 1.8984, 1: 1.8004, 2: 1.8487}
    result = stats.paired_difference(torch_loss, triton_loss)
    differences = [-0.0016, 0.0004, -0.0013]
    mean = sum(differences) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / 2)
    half = T_975[2] * sd / math.sqrt(3)
    assert result["mean"] == pytest.approx(mean, abs=1e-12)
    assert result["low"] == pytest.approx(mean - half, abs=1e-9)
    assert result["high"] == pytest.approx(mean + half, abs=1e-9)
    assert result["low"] < 0 < result["high"] and result["p_value"] > 0.05
    assert result["n"] == 3


def test_a_consistent_difference_is_significant_though_the_spread_is_large():
    # seeds spread widely, but b is always 0.01 above a: pairing sees it
    a = {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0}
    b = {seed: value + 0.01 + 0.001 * (-1) ** seed for seed, value in a.items()}
    result = stats.paired_difference(a, b)
    assert result["p_value"] < 1e-4 and 0.008 < result["low"] < result["high"] < 0.013


def test_tost_declares_equivalence_only_inside_the_margin():
    a = {0: 1.90, 1: 1.80, 2: 1.85, 3: 1.88, 4: 1.83}
    b = {0: 1.901, 1: 1.799, 2: 1.852, 3: 1.879, 4: 1.831}
    wide, narrow = stats.tost(a, b, margin=0.01), stats.tost(a, b, margin=0.001)
    assert wide["equivalent"] and wide["p_value"] < 0.05
    assert not narrow["equivalent"] and narrow["p_value"] >= 0.05
    for margin in (0.0005, 0.001, 0.002, 0.005, 0.01):
        result = stats.tost(a, b, margin=margin)
        inside = -margin < result["low"] and result["high"] < margin
        assert result["equivalent"] == inside  # TOST is the 90 % interval in the margin


def test_tost_refuses_a_difference_as_equivalence():
    a = {0: 1.0, 1: 1.1, 2: 1.2}
    b = {seed: value + 0.05 for seed, value in a.items()}
    assert not stats.tost(a, b, margin=0.01)["equivalent"]


@pytest.mark.parametrize(
    "a, b, options, match",
    [
        ({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0}, {}, "seeds"),
        ({0: 1.0}, {0: 1.1}, {}, "seeds"),
        ({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}, {"margin": 0.0}, "margin"),
        ({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}, {"margin": math.nan}, "margin"),
        ({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}, {"margin": 0.1, "alpha": 0.5}, "alpha"),
    ],
)
def test_bad_input_is_refused_naming_it(a, b, options, match):
    with pytest.raises(ValueError, match=match):
        stats.tost(a, b, **{"margin": 0.1, **options})
