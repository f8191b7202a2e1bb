"""Counterfactual evidence for n-gram drafts: shadow proposals (pure Python).

A request that drafts no n-grams this round still shows what n-gram drafts would
have earned: a proposal made now (``Shadow``) is checked against the tokens the
target commits next, and its outcome is booked as a verified round would be.

Why this is the same evidence: the committed tokens are the target's own samples,
whatever was or was not verified (speculation is exact). Position i of a proposal
matches the committed token with probability p(d_i | the tokens before it), which is
exactly the probability that verifying the point-mass draft d_i would accept it
(greedy: the argmax; sampled: P(target emits d_i)). So (drafted, accepted) of a
shadow has the distribution of a verified round's.

Why it is needed: under load the adaptive rule holds rows at k = 0, and a held row
drafts nothing, so nothing is measured; the n-gram source (which has no draft cost
to learn, only its acceptance) would stay priced at its prior even when requests
replay earlier ones, whose long corpus matches are accepted nearly always. Shadows
cost one n-gram lookup each and no target work; ``SHADOW_ROWS`` bounds the lookups
per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

SHADOW_K = 8     # drafts per shadow proposal: decided within 8 committed tokens
SHADOW_ROWS = 4  # new shadow proposals per engine step at most (CPU: one lookup each)


@dataclass(slots=True)
class Shadow:
    """n-gram drafts proposed at committed length ``start`` but not verified."""

    start: int
    drafts: list[int]
    match: Any  # match_pricing.MatchKey of the match they came from

    def outcome(self, committed_row: Sequence[int], length: int) -> tuple[int, int] | None:
        """(drafted, accepted) once decided by the committed tokens ``committed_row[:length]``
        (a mismatch, or every draft matched); None while still pending."""
        known = min(length - self.start, len(self.drafts))
        for i in range(known):
            if int(committed_row[self.start + i]) != self.drafts[i]:
                return len(self.drafts), i
        return (len(self.drafts), known) if known == len(self.drafts) else None


def take_turns(candidates: list, turn: int, n: int = SHADOW_ROWS) -> list:
    """Up to ``n`` of ``candidates``, the ``turn``-th block of n (cyclically), so that
    a steady list of candidates is covered in ceil(len / n) consecutive turns."""
    if len(candidates) <= n:
        return candidates
    s = (turn * n) % len(candidates)
    return (candidates[s:] + candidates[:s])[:n]
