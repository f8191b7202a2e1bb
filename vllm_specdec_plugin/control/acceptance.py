"""Measured acceptance (pure Python): ``DecayedRate``s of successes / trials (``evidence``:
a geometric model's α), shrunk by ``PRIOR_WEIGHT`` trials towards the level above: a
scope's α towards ``PRIOR_ALPHA``, a request's towards its scope's, an n-gram proposal's
by match bucket (a replay's long corpus match is accepted far more often than a 1-token
one) towards the request's n-gram α."""

from __future__ import annotations

import statistics
from collections import deque

from vllm_specdec_plugin.control.estimators import DecayedRate
from vllm_specdec_plugin.tuning import (ALPHA_DECAY, ALPHA_MAX, MATCH_DECAY, OUTPUT_WINDOW,
                                        PRIOR_ALPHA, PRIOR_WEIGHT, SCOPE_DECAY)

MatchKey = tuple[str, int]  # ("own", n) or ("corpus", bit length of the match length)


def evidence(drafted: int, accepted: int) -> tuple[int, int]:
    """(successes, trials) of one verified round of ``drafted`` drafts."""
    if not 0 <= accepted <= drafted:
        raise ValueError(f"need 0 <= accepted <= drafted, got {accepted}/{drafted}")
    return accepted, accepted + (1 if accepted < drafted else 0)


def expected_tokens(alpha: float, k: int) -> float:
    """E[N] = Σ_{j<=k} α^j: tokens one verification of k drafts emits (k + 1 at α = 1)."""
    e, p = 1.0, 1.0
    for _ in range(k):
        p *= alpha
        e += p
    return e


def match_key(source: str, length: int) -> MatchKey:
    """An n-gram match's bucket: "own" by n, "corpus" by the power of two of its length."""
    if source == "own":
        return ("own", length)
    if source == "corpus":
        return ("corpus", max(length, 1).bit_length())
    raise ValueError(f"match source must be 'own' or 'corpus', got {source!r}")


def _shrunk(rate: DecayedRate | None, prior: float) -> float:
    a = prior if rate is None else rate.value(prior, PRIOR_WEIGHT)
    return min(max(a, 0.0), ALPHA_MAX)


class ScopeRecord:
    """What one scope's requests share: α per source and per match bucket, answer lengths."""

    __slots__ = ("alpha", "matches", "outputs")

    def __init__(self) -> None:
        self.alpha: dict[str, DecayedRate] = {}
        self.matches: dict[MatchKey, DecayedRate] = {}
        self.outputs: deque[int] = deque(maxlen=OUTPUT_WINDOW)

    def source_alpha(self, source: str) -> float:
        return _shrunk(self.alpha.get(source), PRIOR_ALPHA)

    def typical_output(self) -> float | None:
        """The median answer of its last ``OUTPUT_WINDOW`` requests, in tokens."""
        return statistics.median(self.outputs) if self.outputs else None


class Acceptance:
    """One request's α per source, with its scope's record as the prior."""

    __slots__ = ("scope", "rates")

    def __init__(self, scope: ScopeRecord) -> None:
        self.scope = scope
        self.rates: dict[str, DecayedRate] = {}

    def alpha(self, source: str) -> float:
        return _shrunk(self.rates.get(source), self.scope.source_alpha(source))

    def match_alpha(self, match: MatchKey) -> float:
        """α of an n-gram proposal from a match in bucket ``match``."""
        return _shrunk(self.scope.matches.get(match), self.alpha("ngram"))

    def observe(self, source: str, drafted: int, accepted: int,
                match: MatchKey | None = None) -> None:
        """One verified (or shadow) round of ``source``'s drafts."""
        if not drafted:
            return  # no information; decaying would drift α̂ to the prior
        succ, trials = evidence(drafted, accepted)
        for rates, key, decay in ((self.rates, source, ALPHA_DECAY),
                                  (self.scope.alpha, source, SCOPE_DECAY),
                                  (self.scope.matches, match, MATCH_DECAY)):
            if key is not None:
                rates.setdefault(key, DecayedRate(decay)).add(succ, trials)
