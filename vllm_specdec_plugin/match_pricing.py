"""Acceptance of an n-gram proposal by how long a context it matched (pure Python).

A corpus match that reaches 40 tokens back (a request replaying an earlier one) is
accepted far more often than a 3-token common phrase, but a request's own α̂
(``adaptive.AdaptiveK``) cannot tell the two apart, and a new request's α̂ is the
global one. ``MatchAlpha`` keeps acceptance counts per match bucket over all
requests and combines them with the request's α̂ additively in log-odds:

    logit α = logit α̂_request + logit α_bucket - logit α_global

A request with no n-gram rounds has α̂ = α_global and gets α_bucket; a bucket with no
rounds has α_bucket = α_global, so the request's α̂ stands.

Buckets (``match_key``): the request's own history by n (1 .. ngram_max_n); the
corpus by the match length's power of two (3, 4-7, 8-15, ..., 64: the length is
measured back to ``CorpusIndex.MAX_EXTEND`` tokens).
Counts per bucket: successes = accepted, trials = accepted + (1 if a draft was
rejected), as in ``speedup.round_evidence``; both decay by ``decay`` per round of that bucket.

``ANY_MATCH`` prices the most any proposal of a request could get (its best
bucket): before a lookup it bounds what the lookup could find worth drafting
(``lookup_alpha``, the one place that decides which rows it bounds).
"""

from __future__ import annotations

import math

from typing import Any, Callable

from vllm_specdec_plugin.speedup import round_evidence, shrunk_alpha
from vllm_specdec_plugin.tuning import (ALPHA_MAX, MATCH_ALPHA_MIN, MATCH_DECAY,
                                        MATCH_PRIOR_WEIGHT)

MatchKey = tuple[str, int]  # ("own", n) or ("corpus", bit length of the match length)
ANY_MATCH: MatchKey = ("any", 0)  # prices a request's best bucket (see alpha)


def lookup_alpha(alpha_of: Callable[..., float], req_id: str, k: int,
                 why: str) -> float | None:
    """α bounding an n-gram row before its lookup: the best price any of its matches
    could get (``ANY_MATCH``), for a row its controller drafts (k > 0) or holds for
    "adaptive" (a long match may pay where the request's α does not); None for a row
    held for another reason (it is not looked up). alpha_of(req_id, match) -> α."""
    if k or why == "adaptive":
        return alpha_of(req_id, ANY_MATCH)
    return None


def proposal_alpha(controller: Any, store: Any, req_id: str,
                   match: MatchKey | None = None) -> float:
    """α of a request's n-gram drafts: its controller's α̂ (``adaptive.AdaptiveK``), or
    with ``match``, of a proposal from a match in that bucket, from the request's
    scope's ``MatchAlpha`` in ``store`` (a ``tenancy.ScopedStore``; ``ANY_MATCH``: the
    most any of its proposals could get)."""
    if match is None:
        return controller.alpha(req_id)
    scope = controller.scope_of(req_id)
    return store.get(scope).alpha(match, controller.alpha(req_id), controller.global_alpha(scope))


def match_key(source: str, length: int) -> MatchKey:
    """The bucket of a match: ``source`` "own" or "corpus", ``length`` in tokens."""
    if source == "own":
        return ("own", length)
    if source == "corpus":
        return ("corpus", max(length, 1).bit_length())
    raise ValueError(f"match source must be 'own' or 'corpus', got {source!r}")


def _logit(p: float) -> float:
    p = min(max(p, MATCH_ALPHA_MIN), ALPHA_MAX)
    return math.log(p / (1.0 - p))


class MatchAlpha:
    """Decayed acceptance counts per match bucket, and the combined α of a proposal."""

    def __init__(self, prior_weight: float = MATCH_PRIOR_WEIGHT,
                 decay: float = MATCH_DECAY) -> None:
        if prior_weight <= 0 or not 0.0 < decay <= 1.0:
            raise ValueError(f"need prior_weight > 0 and 0 < decay <= 1, "
                             f"got {prior_weight!r}, {decay!r}")
        self.prior_weight, self.decay = prior_weight, decay
        self._counts: dict[MatchKey, list[float]] = {}  # key -> [successes, trials]
        self._best: tuple[float, float] | None = None  # (global α, its best bucket logit)

    def observe(self, key: MatchKey, drafted: int, accepted: int) -> None:
        """One verified n-gram round whose drafts came from a match in ``key``."""
        succ, trials = round_evidence(drafted, accepted)
        if drafted == 0:
            return
        c = self._counts.setdefault(key, [0.0, 0.0])
        c[0] = self.decay * c[0] + succ
        c[1] = self.decay * c[1] + trials
        self._best = None

    def bucket_alpha(self, key: MatchKey, global_alpha: float) -> float:
        """α of the bucket, shrunk towards ``global_alpha`` by ``prior_weight`` trials."""
        s, t = self._counts.get(key, (0.0, 0.0))
        return shrunk_alpha(s, t, global_alpha, self.prior_weight)

    def alpha(self, key: MatchKey, request_alpha: float, global_alpha: float) -> float:
        """α of a proposal from a match in ``key`` for a request whose n-gram α̂ is
        ``request_alpha`` (``global_alpha``: the n-gram source's α over all requests).
        ``ANY_MATCH``: the most any proposal of the request could get (its best bucket,
        or one without rounds, which leaves ``request_alpha``)."""
        if key == ANY_MATCH:
            z_bucket = self._best_logit(global_alpha)
        else:
            z_bucket = _logit(self.bucket_alpha(key, global_alpha))
        z = _logit(request_alpha) + z_bucket - _logit(global_alpha)
        return min(1.0 / (1.0 + math.exp(-z)), ALPHA_MAX)

    def _best_logit(self, global_alpha: float) -> float:
        """max logit α_bucket over the buckets and an empty one; cached per
        (global α, counts) since every row of a step asks for it."""
        if self._best is None or self._best[0] != global_alpha:
            z = max([_logit(self.bucket_alpha(key, global_alpha)) for key in self._counts]
                    + [_logit(global_alpha)])
            self._best = (global_alpha, z)
        return self._best[1]
