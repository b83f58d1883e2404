"""Paired statistics for runs that share a seed (issue 17, item 2).

Two configurations trained with one seed share their initial weights and batches, so the
difference between them, seed by seed, is the measurement; its mean over seeds gets a
Student t interval. Equivalence is not the absence of a difference: ``tost`` declares
two configurations equivalent when the (1 - 2 alpha) interval of the paired difference
lies inside a margin declared before the runs (two one-sided tests).

Student's t distribution is computed here (regularized incomplete beta by continued
fraction, quantiles by bisection), with no dependency beyond ``math``.
"""

import math


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, by Lentz's continued
    fraction (Numerical Recipes, betacf), on the side where it converges fast."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = (
        math.exp(
            math.lgamma(a + b)
            - math.lgamma(a)
            - math.lgamma(b)
            + a * math.log(x)
            + b * math.log1p(-x)
        )
        / a
    )
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * result


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection of ``t_cdf``."""
    if not 0 < p < 1:
        raise ValueError(f"p: must be in (0, 1), got {p}")
    low, high = -1e4, 1e4
    for _ in range(200):
        middle = (low + high) / 2
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _paired(a: dict, b: dict) -> list[float]:
    """b - a, seed by seed; ValueError unless both hold the same seeds, at least two."""
    if a.keys() != b.keys():
        raise ValueError(
            f"seeds: a has {sorted(a)}, b has {sorted(b)}; pairs need both"
        )
    if len(a) < 2:
        raise ValueError(f"seeds: a paired interval needs at least 2, got {len(a)}")
    return [b[seed] - a[seed] for seed in sorted(a)]


def _mean_and_error(differences: list[float]) -> tuple[float, float]:
    n = len(differences)
    mean = sum(differences) / n
    variance = sum((d - mean) ** 2 for d in differences) / (n - 1)
    return mean, math.sqrt(variance / n)


def paired_difference(a: dict, b: dict, confidence: float = 0.95) -> dict:
    """The mean over seeds of ``b[seed] - a[seed]`` with its two-sided ``confidence``
    t interval and the p value of 'no difference'. ``a``, ``b``: {seed: value}."""
    differences = _paired(a, b)
    mean, error = _mean_and_error(differences)
    df = len(differences) - 1
    half = t_quantile(0.5 + confidence / 2, df) * error
    if error == 0:
        p_value = 1.0 if mean == 0 else 0.0
    else:
        p_value = 2 * t_cdf(-abs(mean) / error, df)
    return {
        "mean": mean,
        "low": mean - half,
        "high": mean + half,
        "n": len(differences),
        "confidence": confidence,
        "p_value": p_value,
    }


def tost(a: dict, b: dict, margin: float, alpha: float = 0.05) -> dict:
    """Two one-sided tests: are ``a`` and ``b`` equivalent within ``margin``, declared
    before the runs? Equivalent when both 'difference <= -margin' and 'difference >=
    margin' are rejected at ``alpha``, that is when the (1 - 2 alpha) interval of the
    paired difference lies inside (-margin, margin)."""
    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin: must be finite and positive, got {margin}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha: must be in (0, 0.5), got {alpha}")
    differences = _paired(a, b)
    mean, error = _mean_and_error(differences)
    df = len(differences) - 1
    if error == 0:
        p_value = 0.0 if abs(mean) < margin else 1.0
    else:
        p_lower = 1 - t_cdf((mean + margin) / error, df)  # H0: difference <= -margin
        p_upper = t_cdf((mean - margin) / error, df)  # H0: difference >= margin
        p_value = max(p_lower, p_upper)
    interval = paired_difference(a, b, confidence=1 - 2 * alpha)
    return {
        "equivalent": p_value < alpha,
        "p_value": p_value,
        "margin": margin,
        "mean": mean,
        "low": interval["low"],
        "high": interval["high"],
        "n": len(differences),
        "alpha": alpha,
    }


def verdict(a: dict, b: dict, margin: float, alpha: float = 0.05) -> dict:
    """``b`` against ``a`` by the rule of the committed margins
    (``results/training_h100_margins.json``): "equivalent" when TOST at ``alpha``
    passes within ``margin``; else "higher" or "lower" when the (1 - ``alpha``)
    interval of ``b - a`` lies above or below 0; else "inconclusive". With the interval,
    its p value and TOST's."""
    interval = paired_difference(a, b, confidence=1 - alpha)
    equivalence = tost(a, b, margin, alpha)
    if equivalence["equivalent"]:
        word = "equivalent"
    elif interval["low"] > 0:
        word = "higher"
    elif interval["high"] < 0:
        word = "lower"
    else:
        word = "inconclusive"
    return {
        "verdict": word,
        **interval,
        "margin": margin,
        "tost_p_value": equivalence["p_value"],
    }
