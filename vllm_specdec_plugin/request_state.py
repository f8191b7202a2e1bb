"""The one record per request: its draft KV, acceptance, time budget and scope.

A request's draft KV holds ``tokens`` (committed tokens, then the drafts whose KV a
round computed); after verification everything past the accepted prefix is trimmed
(``kv``: whole tail blocks freed, stale slots of a partial one overwritten later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_specdec_plugin.control.acceptance import Acceptance, ScopeRecord
from vllm_specdec_plugin.kv import BlockAllocator, BlockTable
from vllm_specdec_plugin.stats import ProposerStats, RequestAcceptance
from vllm_specdec_plugin.tuning import CREDIT_MAX


@dataclass(slots=True)
class RequestState:
    """One request, as the proposer sees it across rounds."""

    table: BlockTable = field(default_factory=BlockTable)
    tokens: list[int] = field(default_factory=list)  # tokens whose draft KV is cached
    committed: int = 0      # committed length when we last drafted
    drafted: list[int] = field(default_factory=list)  # drafts proposed last round
    source: str = "draft"   # who proposed them: "draft" (model) or "ngram"
    match: Any = None       # n-gram drafts: the match bucket they came from (control.acceptance)
    seen: bool = False      # had a propose() round since its (re)prefill
    scope: Any = None       # tenancy.scope_key: whose corpus and statistics it shares
    learned: Acceptance = field(default_factory=lambda: Acceptance(ScopeRecord()))  # α per source
    acceptance: RequestAcceptance = field(default_factory=RequestAcceptance)  # for responses
    ngram: Any = None       # NGramIndex over the committed tokens (ngram/hybrid)
    shadow: Any = None      # shadow.Shadow: n-gram drafts proposed, not verified, pending
    shadow_turn: int = -1   # ShadowBook's step of its last shadow lookup (-1: none yet)
    credit: float = 0.0     # time-per-token budget saved (+) or owed (-), plain steps (``settle``)
    first_length: int = 0   # committed length at its first round (prompt + 1)
    length: int = 0         # committed length at its latest round

    def round_at(self, length: int) -> None:  # a propose() round sees it at ``length``
        self.seen = True
        self.first_length = self.first_length or length
        self.length = length

    @property
    def output_tokens(self) -> int:  # emitted, as far as its rounds saw
        return self.length - self.first_length + 1 if self.first_length else 0

    def settle(self, tokens: int, step: float, tpot_limit: float) -> None:
        """A decode step without prefill emitted ``tokens`` for it in ``step`` plain steps:
        a plain step saves ``tpot_limit - 1``, others' drafts spend it, accepted drafts
        earn it; clipped to ±CREDIT_MAX."""
        c = self.credit + tpot_limit * tokens - step
        self.credit = min(max(c, -CREDIT_MAX), CREDIT_MAX)

    def reset_for_prefill(self) -> None:  # preempted: re-prefilled lazily when back
        self.tokens.clear()
        self.drafted = []
        self.seen = False


def book_verification(req: RequestState, num_accepted: int, committed_row: np.ndarray,
                      allocator: BlockAllocator | None, stats: ProposerStats) -> None:
    """The verification of a request's last drafts: its source's (and match bucket's)
    acceptance learns the round; the draft KV rolls back. Nothing without drafts."""
    if not req.drafted:
        return
    accepted = max(0, min(num_accepted, len(req.drafted)))
    req.learned.observe(req.source, len(req.drafted), accepted, req.match)
    roll_back(req, accepted, committed_row, allocator, stats)


def roll_back(req: RequestState, accepted: int, committed_row: np.ndarray,
              allocator: BlockAllocator | None, stats: ProposerStats) -> None:
    """Book a verified round and trim the draft KV to what was accepted: the round cached
    the committed tokens and d1..d_{k-1} (never d_k's), of which the first ``accepted``
    (clamped by the caller) stay valid. committed_row: the runner's committed tokens."""
    drafted = req.drafted
    req.acceptance.rounds += 1
    req.acceptance.drafted += len(drafted)
    req.acceptance.accepted += accepted
    stats.record_verification(req.source, len(drafted), accepted)
    valid = min(req.committed + accepted, len(req.tokens))
    # Defensive cross-check against the committed tokens (cheap: <= k entries).
    lo = req.committed
    if committed_row[lo:valid].tolist() != req.tokens[lo:valid]:
        stats.resyncs += 1
        match = lo
        while match < valid and committed_row[match] == req.tokens[match]:
            match += 1
        valid = match
    truncate(req, valid, allocator)
    req.drafted = []


def commit_round(plan: Any, source: str, stats: ProposerStats) -> None:
    """Book a ``planning.Plan``'s drafts from ``source`` on its request, for the next
    verification."""
    req = plan.req
    if source == "ngram":
        req.shadow = None  # a verified round measures the same thing
    stats.by_source[source] += 1
    req.committed = plan.length
    req.drafted = list(plan.drafts)
    req.source = source
    req.match = plan.match


def keep_scheduled(req: RequestState, scheduled: int, allocator: BlockAllocator | None) -> int:
    """Only the first ``scheduled`` drafts are verified (the step plan or vLLM's budget
    cut the rest): forget the others, and with none left drop their KV now; returns how
    many were cut."""
    cut = len(req.drafted) - scheduled
    if cut <= 0:
        return 0
    del req.drafted[scheduled:]
    if not req.drafted:
        truncate(req, min(req.committed, len(req.tokens)), allocator)
    return cut


def truncate(req: RequestState, num_tokens: int, allocator: BlockAllocator | None) -> None:
    """Keep the first ``num_tokens`` cached tokens of a request; free the rest."""
    del req.tokens[num_tokens:]
    req.table.num_tokens = min(req.table.num_tokens, num_tokens)
    if allocator is not None:
        allocator.trim(req.table, num_tokens)
