"""Two-sample tests for sampled-output distributions (pure Python + scipy).

LM outputs over 2-3 tokens are spread over thousands of outcomes, far more than any
affordable sample can resolve. The test therefore compares the two samples on a
coarsened outcome space: the ``top`` most frequent outcomes of the pooled sample,
plus one cell for everything else. A wrong sampler moves mass between likely
outcomes (e.g. toward the draft's favourites), which this space sees.
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence


def two_sample_chi2(a: Sequence[Hashable], b: Sequence[Hashable], top: int = 30) -> tuple[float, int, float]:
    """Chi-squared homogeneity test on the ``top`` pooled outcomes + the rest.

    Returns (statistic, dof, p_value); a small p-value means the samples differ.
    """
    from scipy.stats import chi2

    ca, cb = Counter(a), Counter(b)
    keys = sorted(set(ca) | set(cb), key=lambda k: (-(ca[k] + cb[k]), repr(k)))
    cells = [(ca[k], cb[k]) for k in keys[:top]]
    rest = (sum(ca[k] for k in keys[top:]), sum(cb[k] for k in keys[top:]))
    if sum(rest):
        cells.append(rest)
    if len(cells) < 2:
        return 0.0, 0, 1.0
    na, nb = len(a), len(b)
    n = na + nb
    stat = 0.0
    for x, y in cells:
        for obs, size in ((x, na), (y, nb)):
            exp = (x + y) * size / n
            stat += (obs - exp) ** 2 / exp
    dof = len(cells) - 1
    return stat, dof, float(chi2.sf(stat, dof))


def total_variation(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """Empirical total-variation distance between two samples."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    return 0.5 * sum(abs(ca.get(k, 0) / na - cb.get(k, 0) / nb) for k in set(ca) | set(cb))
