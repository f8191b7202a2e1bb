"""Paired-ratio statistics for repeated benchmark runs (pure Python, no numpy needed).

A benchmark repetition measures every configuration on the same workload close
together in time. The speedup of configuration X in repetition r is the *paired*
ratio ``tps_X[r] / tps_base[r]``; machine drift between repetitions then cancels
in each ratio instead of inflating the spread. We report the median of the ratios,
their quartiles and range, and a distribution-free confidence interval for the
median (order statistics of a Binomial(n, 1/2)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["geomean", "median", "median_ci", "paired_ratios", "quantile", "summarize"]


def _clean(values: Sequence[float]) -> list[float]:
    xs = [float(v) for v in values]
    if any(math.isnan(x) for x in xs):
        raise ValueError("NaN in values")
    return sorted(xs)


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default, Hyndman-Fan type 7)."""
    xs = _clean(values)
    if not xs:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def geomean(values: Sequence[float]) -> float:
    """Geometric mean: the average of ratios (0.5x and 2x average to 1x)."""
    xs = _clean(values)
    if not xs or xs[0] <= 0:
        raise ValueError("geomean needs at least one value, all > 0")
    return math.exp(math.fsum(math.log(x) for x in xs) / len(xs))


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per-repetition ratios numerator[r] / denominator[r] (e.g. tok/s over baseline tok/s)."""
    if len(numerator) != len(denominator):
        raise ValueError(f"unpaired samples: {len(numerator)} vs {len(denominator)}")
    out = []
    for a, b in zip(numerator, denominator):
        if not (b > 0) or not (a >= 0):
            raise ValueError(f"ratio needs a >= 0 and b > 0, got {a} / {b}")
        out.append(float(a) / float(b))
    return out


def _binom_cdf_half(j: int, n: int) -> float:
    """P(Binomial(n, 1/2) <= j)."""
    return math.fsum(math.comb(n, i) for i in range(0, j + 1)) / 2.0 ** n


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Distribution-free CI for the median: (low, high, achieved coverage).

    The interval [x_(j), x_(n+1-j)] (1-based order statistics) covers the median with
    probability 1 - 2 P(Bin(n, 1/2) <= j - 1). We take the narrowest such interval
    with coverage >= level; if even [min, max] falls short (n < 6 at 95%), we return
    [min, max] and its smaller, true coverage rather than pretend.
    """
    xs = _clean(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_ci of no values")
    best = (xs[0], xs[-1], 1.0 - 2.0 * _binom_cdf_half(0, n) if n > 1 else 0.0)
    for j in range(1, n // 2 + 1):
        cover = 1.0 - 2.0 * _binom_cdf_half(j - 1, n)
        if cover >= level:
            best = (xs[j - 1], xs[n - j], cover)
        else:
            break
    return best


def summarize(values: Sequence[float], level: float = 0.95) -> dict:
    """Median, quartiles, range, relative spread and a CI for the median.

    rel_iqr = (q75 - q25) / median: the noise figure to compare effects against.
    """
    xs = _clean(values)
    if not xs:
        return {"n": 0}
    med = median(xs)
    q25, q75 = quantile(xs, 0.25), quantile(xs, 0.75)
    lo, hi, cover = median_ci(xs, level)
    return {
        "n": len(xs), "median": med, "q25": q25, "q75": q75, "min": xs[0], "max": xs[-1],
        "rel_iqr": (q75 - q25) / med if med else float("nan"),
        "ci_low": lo, "ci_high": hi, "ci_coverage": cover,
    }
