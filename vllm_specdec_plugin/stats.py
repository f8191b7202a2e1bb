"""Acceptance and capacity bookkeeping of the proposer (pure Python)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestAcceptance:
    """One request's speculation record."""

    rounds: int = 0     # verification rounds in which it had drafts
    drafted: int = 0    # draft tokens verified by the target
    accepted: int = 0   # of those, accepted


@dataclass(slots=True)
class ProposerStats:
    """Engine-lifetime counters."""

    rounds: int = 0                 # propose() calls that drafted for >= 1 request
    prefill_tokens: int = 0         # tokens run through the draft to catch up/prefill
    max_round_prefill: int = 0      # most catch-up tokens fed in one round (<= the budget)
    no_draft: Counter = field(default_factory=Counter)  # reason -> request-rounds
    by_source: Counter = field(default_factory=Counter)  # "draft"/"ngram" -> request-rounds
    drafted_by: Counter = field(default_factory=Counter)   # source -> draft tokens verified
    accepted_by: Counter = field(default_factory=Counter)  # source -> of those, accepted
    resyncs: int = 0                # draft cache disagreed with committed tokens
    shadow_drafted: int = 0         # shadow n-gram drafts decided (``shadow``)
    shadow_accepted: int = 0        # of those, matched by the committed tokens

    def record_verification(self, source: str, drafted: int, accepted: int) -> None:
        self.drafted_by[source] += drafted
        self.accepted_by[source] += accepted

    @property
    def drafted(self) -> int:  # draft tokens verified, every source
        return sum(self.drafted_by.values())

    @property
    def accepted(self) -> int:
        return sum(self.accepted_by.values())
