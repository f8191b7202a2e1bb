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
rejected), as in ``adaptive``; both decay by ``decay`` per round of that bucket.

``ANY_MATCH`` prices the most any proposal of a request could get (its best
bucket): before a lookup it bounds what the lookup could find worth drafting.
"""

from __future__ import annotations

import math

from vllm_specdec_plugin.adaptive import ALPHA_MAX, round_evidence, shrunk_alpha

MatchKey = tuple[str, int]  # ("own", n) or ("corpus", bit length of the match length)
ANY_MATCH: MatchKey = ("any", 0)  # prices a request's best bucket (see alpha)
_ALPHA_MIN = 1e-3  # log-odds stay finite


def match_key(source: str, length: int) -> MatchKey:
    """The bucket of a match: ``source`` "own" or "corpus", ``length`` in tokens."""
    if source == "own":
        return ("own", length)
    if source == "corpus":
        return ("corpus", max(length, 1).bit_length())
    raise ValueError(f"match source must be 'own' or 'corpus', got {source!r}")


def _logit(p: float) -> float:
    p = min(max(p, _ALPHA_MIN), ALPHA_MAX)
    return math.log(p / (1.0 - p))


class MatchAlpha:
    """Decayed acceptance counts per match bucket, and the combined α of a proposal."""

    def __init__(self, prior_weight: float = 4.0, decay: float = 0.98) -> None:
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
