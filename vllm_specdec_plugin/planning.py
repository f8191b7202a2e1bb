"""Each row's offers for the step policy (n-gram: lookup over its own history or its
scope's finished requests, priced by the match bucket's α; the draft model: up to its
room at its α, paying the forward's share and its catch-up), and the round's plans once
it decided (``plan``; ``fit``: the feed budget, longer catch-ups chunked, draft KV).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from vllm_specdec_plugin.control.acceptance import MatchKey, expected_tokens, match_key
from vllm_specdec_plugin.control.cost import Prices
from vllm_specdec_plugin.control.policy import Offer, RowView
from vllm_specdec_plugin.kv import BlockAllocator
from vllm_specdec_plugin.ngram import NGramIndex
from vllm_specdec_plugin.ngram_corpus import CorpusIndex
from vllm_specdec_plugin.request_state import RequestState, truncate
from vllm_specdec_plugin.tenancy import ScopedCorpus
from vllm_specdec_plugin.tuning import NGRAM_MAX_N, NGRAM_MIN_N, NGRAM_MIN_PROB


@dataclass(slots=True)
class Plan:
    """One request's work in this round."""

    row: int                # row in the runner's batch
    req_id: str
    req: RequestState
    new_tokens: list[int]   # committed tokens to feed this round
    length: int             # committed length L
    k: int                  # drafts wanted this round (0: prefill chunk only)
    spec: Any = None        # SamplingSpec of a sampled request drafting from q, else None
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    grammar: Any = None     # structured output: the request's grammar copy (masks drafts)
    match: MatchKey | None = None  # n-gram drafts: the bucket of the match they came from

    @property
    def cached(self) -> int:  # position of the first token fed this round
        return len(self.req.tokens)


@dataclass(slots=True)
class Lookup:
    """A row's n-gram lookup this step, for ``plan``."""

    drafts: list[int]
    match: MatchKey | None


class Planner:
    """Offers and plans per row; owns the finished-request corpus, no per-request state."""

    def __init__(self, method: str, k: int, max_model_len: int, corpus_tokens: int,
                 corpus_scope: str, prefill_budget: int, no_draft: Callable[[str], None]):
        self.k = k
        self.max_model_len = max_model_len
        self.prefill_budget = prefill_budget  # committed tokens a round may feed (vLLM's budget)
        self.allocator: BlockAllocator | None = None  # set once the draft is loaded
        self.no_draft = no_draft  # counts a request-round without drafts, by reason
        self.uses_model = method in ("draft", "hybrid")
        self.uses_ngram = method in ("ngram", "hybrid")
        self.corpus: ScopedCorpus | None = None  # finished requests, per scope (the caller adds)
        if self.uses_ngram and corpus_tokens and corpus_scope != "off":
            self.corpus = ScopedCorpus(corpus_tokens, lambda: CorpusIndex(
                corpus_tokens, NGRAM_MAX_N, NGRAM_MIN_N, NGRAM_MIN_PROB))

    def room(self, length: int, end: int | None) -> int:
        """Most drafts at committed length L (none past ``end`` or max_model_len)."""
        limit = self.max_model_len if end is None else min(end, self.max_model_len)
        return min(self.k, limit - length - 1)

    def offers(self, req: RequestState, length: int, committed_row: np.ndarray,
               end: int | None, prices: Prices) -> tuple[RowView, Lookup | None]:
        """The row's offers and its n-gram lookup."""
        req.round_at(length)
        room = self.room(length, end)
        offers: list[Offer] = []
        lookup = None
        if room > 0 and self.uses_ngram:
            drafts, match = self._ngram_drafts(req, committed_row, length, room)
            lookup = Lookup(drafts, match)
            if drafts:
                offers.append(Offer("ngram", req.learned.match_alpha(match), len(drafts)))
        if room > 0 and self.uses_model:
            alpha = req.learned.alpha("draft")
            offers.append(self._model_offer(req, length, end, room, alpha, prices))
        return RowView(offers, req.credit), lookup

    def _model_offer(self, req: RequestState, length: int, end: int | None, room: int,
                     alpha: float, prices: Prices) -> Offer:
        """A lagging draft KV, fed first, delays the step by lag·c1: in full now, spread over
        the rounds of what it may still emit (at most its scope's median answer: no
        max_tokens does not make a catch-up look free)."""
        lag = length - len(req.tokens) - 1  # beyond the one token a drafting row feeds
        now = once = 0.0
        if lag > 0 and prices.catch_up:
            now = lag * prices.catch_up
            limit = self.max_model_len if end is None else min(end, self.max_model_len)
            horizon = limit - length
            typical = req.learned.scope.typical_output()
            if typical is not None:
                horizon = min(horizon, typical)
            once = now / max(1.0, horizon / expected_tokens(alpha, room))
        return Offer("draft", alpha, room, prices.draft_token, now=now, once=once)

    def plan(self, row: int, req_id: str, req: RequestState, length: int,
             committed_row: np.ndarray, source: str, k: int, lookup: Lookup | None) -> Plan:
        """The round's work for a row the policy gave ``k`` drafts from ``source``."""
        if source == "ngram":
            return Plan(row=row, req_id=req_id, req=req, new_tokens=[], length=length, k=k,
                        drafts=lookup.drafts[:k], match=lookup.match)
        if len(req.tokens) >= length:  # nothing new (cannot happen in vLLM's flow):
            truncate(req, length - 1, self.allocator)  # re-feed the last token for logits
        return Plan(row=row, req_id=req_id, req=req,
                    new_tokens=committed_row[len(req.tokens):length].tolist(),
                    length=length, k=k)

    def fit(self, plans: list[Plan], catch_up_room: int | None) -> list[Plan]:
        """The plans that run, by k descending, within vLLM's budget and ``catch_up_room``:
        smallest catch-ups first; one past what is left feeds a chunk without drafts, one
        the pool cannot hold drafts nothing (both counted); draft KV reserved."""
        budget = self.prefill_budget if catch_up_room is None else min(self.prefill_budget,
                                                                        catch_up_room)
        run: list[Plan] = []
        for p in sorted(plans, key=lambda p: len(p.new_tokens)):
            if len(p.new_tokens) > budget:
                if budget <= 0:
                    self.no_draft("prefill_budget")
                    continue
                p.new_tokens, p.k = p.new_tokens[:budget], 0
            need = p.cached + len(p.new_tokens) + max(p.k - 1, 0)
            if not self.allocator.can_reserve(p.req.table, need):
                self.no_draft("pool_full")
                continue
            self.allocator.reserve(p.req.table, need)
            budget -= len(p.new_tokens)
            if p.k == 0:
                self.no_draft("prefill_budget")
            run.append(p)
        run.sort(key=lambda p: -p.k)
        return run

    def shadow_drafts(self, req: RequestState, committed_row: np.ndarray, length: int,
                      k: int, end: int | None = None) -> tuple[list[int], MatchKey | None]:
        """Up to ``k`` n-gram drafts (within the room) and their bucket, for ``shadow``."""
        k = min(k, self.room(length, end))
        if k <= 0:
            return [], None
        return self._ngram_drafts(req, committed_row, length, k)

    def _ngram_drafts(self, req: RequestState, committed_row: np.ndarray, length: int,
                      k: int) -> tuple[list[int], MatchKey]:
        """Drafts from the own history, or a finished request's where that matches longer,
        and their bucket."""
        if req.ngram is None:
            req.ngram = NGramIndex()  # NGramConfig's defaults: the tuning constants
        if len(req.ngram) < length:
            req.ngram.extend(committed_row[len(req.ngram):length])
        own_n = req.ngram.longest_match()
        corpus = self.corpus.get(req.scope) if self.corpus is not None else None
        if corpus is not None:
            drafts, n = corpus.propose(req.ngram.tokens, k)
            room = min(k, n)  # a corpus draft is no longer than its match
            if drafts and n > own_n:
                if len(drafts) < room:
                    # A corpus match near its sequence's end (periodic text) offers few
                    # tokens: where the own history proposes them and more, take that.
                    own = req.ngram.propose(room)
                    if len(own) > len(drafts) and own[:len(drafts)] == drafts:
                        return own, match_key("corpus", n)
                return drafts, match_key("corpus", n)
        return req.ngram.propose(k), match_key("own", own_n)
