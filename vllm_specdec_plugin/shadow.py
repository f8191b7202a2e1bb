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
from typing import Any, Callable, Sequence

from vllm_specdec_plugin.tuning import SHADOW_K, SHADOW_ROWS


@dataclass(slots=True)
class Shadow:
    """n-gram drafts proposed at committed length ``start`` but not verified."""

    start: int
    drafts: list[int]
    match: Any  # control.acceptance.MatchKey of the match they came from

    def outcome(self, committed_row: Sequence[int], length: int) -> tuple[int, int] | None:
        """(drafted, accepted) once decided by the committed tokens ``committed_row[:length]``
        (a mismatch, or every draft matched); None while still pending."""
        known = min(length - self.start, len(self.drafts))
        for i in range(known):
            if int(committed_row[self.start + i]) != self.drafts[i]:
                return len(self.drafts), i
        return (len(self.drafts), known) if known == len(self.drafts) else None


def take_turns(candidates: list, last_turn: Callable[[Any], int], n: int = SHADOW_ROWS) -> list:
    """Up to ``n`` of ``candidates``: those whose last turn (``last_turn``; -1: never)
    is oldest, ties in list order. A steady list is covered in ceil(len / n)
    consecutive steps, and who is picked depends only on the requests present, not
    on how many steps ran before (another tenant's past traffic changes nothing:
    ``tenancy``)."""
    if len(candidates) <= n:
        return candidates
    return sorted(candidates, key=last_turn)[:n]  # stable: ties keep list order


class ShadowBook:
    """Makes and books a proposer's shadow proposals.

    shadow_drafts: ``Planner.shadow_drafts``; stats/metrics: the proposer's
    ``ProposerStats`` and ``ProposerMetrics``."""

    def __init__(self, shadow_drafts: Any, stats: Any, metrics: Any) -> None:
        self.shadow_drafts, self.stats, self.metrics = shadow_drafts, stats, metrics
        self._turn = 0  # steps with shadow proposals; a request's last one is its turn

    def book(self, req: Any, committed_row: Sequence[int], length: int) -> None:
        """Book a request's (``RequestState``) shadow proposal once the committed
        tokens ``committed_row[:length]`` decide it, as the n-gram round it would
        have been."""
        outcome = req.shadow.outcome(committed_row, length) if req.shadow else None
        if outcome is None:
            return
        drafted, accepted = outcome
        req.learned.observe("ngram", drafted, accepted, req.shadow.match)
        self.stats.shadow_drafted += drafted
        self.stats.shadow_accepted += accepted
        self.metrics.shadow(drafted, accepted)
        req.shadow = None

    def propose(self, rows: list[int], req_ids: list[str], requests: dict, token_ids_cpu: Any,
                num_tokens_no_spec: Any, end: Any) -> None:
        """Shadow proposals for a few of ``rows`` (those that verify no n-gram drafts
        next step) that have none pending (``take_turns``). token_ids_cpu:
        [rows, max_model_len] committed tokens; num_tokens_no_spec: [rows] lengths;
        end(row, req_id): the committed length at which the request finishes."""
        idle = [r for r in rows if requests[req_ids[r]].shadow is None]
        self._turn += 1
        for row in take_turns(idle, lambda r: requests[req_ids[r]].shadow_turn):
            req, length = requests[req_ids[row]], int(num_tokens_no_spec[row])
            req.shadow_turn = self._turn  # its turn, whether or not a match is found
            drafts, match = self.shadow_drafts(req, token_ids_cpu[row], length, SHADOW_K,
                                               end(row, req_ids[row]))
            if drafts:
                req.shadow = Shadow(length, drafts, match)
