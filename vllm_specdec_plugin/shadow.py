"""Shadow proposals (pure Python): n-gram drafts for a row that verifies none, checked
against the tokens committed next (the target's own samples: d_i matches with the chance
verifying it would accept it) and booked as a verified round. Without them a row held at
k = 0 measures nothing and n-grams stay at their prior, even for replays."""

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
        """(drafted, accepted) once ``committed_row[:length]`` decides it; None pending."""
        known = min(length - self.start, len(self.drafts))
        for i in range(known):
            if int(committed_row[self.start + i]) != self.drafts[i]:
                return len(self.drafts), i
        return (len(self.drafts), known) if known == len(self.drafts) else None


def take_turns(candidates: list, last_turn: Callable[[Any], int], n: int = SHADOW_ROWS) -> list:
    """Up to ``n`` candidates, oldest ``last_turn`` first (ties in order): a steady list is
    covered in ceil(len / n) steps, by the requests present alone (not others' past)."""
    if len(candidates) <= n:
        return candidates
    return sorted(candidates, key=last_turn)[:n]  # stable: ties keep list order


class ShadowBook:
    """Makes and books a proposer's shadow proposals (``Planner.shadow_drafts``)."""

    def __init__(self, shadow_drafts: Any, stats: Any, metrics: Any) -> None:
        self.shadow_drafts, self.stats, self.metrics = shadow_drafts, stats, metrics
        self._turn = 0  # steps with shadow proposals; a request's last one is its turn

    def book(self, req: Any, committed_row: Sequence[int], length: int) -> None:
        """Book a request's shadow once ``committed_row[:length]`` decides it."""
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
        """Shadows for a few of ``rows`` (no n-gram drafts next) with none pending;
        ``end(row, req_id)``: where the request ends."""
        idle = [r for r in rows if requests[req_ids[r]].shadow is None]
        self._turn += 1
        for row in take_turns(idle, lambda r: requests[req_ids[r]].shadow_turn):
            req, length = requests[req_ids[row]], int(num_tokens_no_spec[row])
            req.shadow_turn = self._turn  # its turn, whether or not a match is found
            drafts, match = self.shadow_drafts(req, token_ids_cpu[row], length, SHADOW_K,
                                               end(row, req_ids[row]))
            if drafts:
                req.shadow = Shadow(length, drafts, match)
