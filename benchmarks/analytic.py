"""The analytic speedup bound of draft-then-verify speculative decoding (pure Python).

Vocabulary (as in vLLM's rejection sampler): each *round* the draft proposes ``k``
draft tokens; the target verifies them in one forward and emits the *accepted* prefix
plus one *recovered* token (at the first rejection) or one *bonus* token (all k
accepted). So a round emits between 1 and k + 1 tokens.

Model (Leviathan et al. 2023, Chen et al. 2023): every draft position is accepted
independently with probability ``alpha`` given that all earlier positions were.
Then the expected tokens per round is

    E[N] = sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha)     (-> k + 1 as alpha -> 1)

If one draft step costs ``c`` target decode steps (c' = t_draft / t_target) and a
verification forward costs one target decode step, a round costs ``1 + k c`` target
steps, and the speedup over plain decoding can be at most

    S = E[N] / (1 + k c).

Note on alpha: vLLM's ``accepted / draft tokens`` counter ratio is *not* this alpha:
it is E[accepted] / k, the mean over positions of the *unconditional* acceptance
probability. ``alpha_from_mean_accepted_length`` returns the alpha of the model
above that reproduces a measured mean accepted length.
"""

from __future__ import annotations

import math

__all__ = [
    "alpha_from_mean_accepted_length",
    "efficiency",
    "expected_tokens_per_round",
    "speedup_bound",
    "unconditional_acceptance",
]


def _check(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0 or math.isnan(alpha):
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0 or int(k) != k:
        raise ValueError(f"k must be a non-negative integer, got {k}")


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E[N] = (1 - alpha^(k+1)) / (1 - alpha) tokens per round; k + 1 at alpha = 1.

    Evaluated as the finite geometric sum, which has no 0/0 at alpha -> 1 and no
    cancellation near it.
    """
    _check(alpha, k)
    return math.fsum(alpha ** i for i in range(int(k) + 1))


def speedup_bound(alpha: float, k: int, c: float) -> float:
    """S = E[N] / (1 + k c): the speedup over no speculation at zero overhead.

    c: draft step time / target decode step time (c' >= 0).
    """
    if c < 0 or math.isnan(c):
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    return expected_tokens_per_round(alpha, k) / (1.0 + k * c)


def efficiency(measured_speedup: float, bound: float) -> float:
    """Measured speedup as a fraction of the analytic bound (1.0 = at the bound)."""
    if bound <= 0:
        raise ValueError(f"bound must be > 0, got {bound}")
    return measured_speedup / bound


def unconditional_acceptance(alpha: float, k: int) -> list[float]:
    """P(draft position i is accepted) = alpha^(i+1), i = 0..k-1 (the per-position curve).

    Also the form of vLLM's ``synthetic_acceptance_rates`` for a fixed alpha.
    """
    _check(alpha, k)
    return [alpha ** (i + 1) for i in range(int(k))]


def alpha_from_mean_accepted_length(mean_len: float, k: int, tol: float = 1e-12) -> float:
    """The alpha whose E[N] equals ``mean_len`` (1 + accepted / rounds), by bisection.

    E[N] rises strictly from 1 (alpha = 0) to k + 1 (alpha = 1), so the inverse is
    unique; values outside [1, k + 1] are clamped to 0 and 1.
    """
    _check(0.0, k)
    if k == 0 or mean_len <= 1.0:
        return 0.0
    if mean_len >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if expected_tokens_per_round(mid, k) < mean_len:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
