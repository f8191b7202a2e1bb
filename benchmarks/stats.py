"""Quantiles and the geometric mean of the serving report (pure Python, no numpy needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["geomean", "median", "quantile"]


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
