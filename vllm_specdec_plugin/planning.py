"""Each round's plan per request: how many drafts, from which source, what to feed.

A request gets n-gram drafts (ready at once, point masses: from its own history, or
the continuation of a finished request's, whichever matches the longer context; its
own history's run where that agrees with a shorter corpus run and goes on), a
draft-model plan (the committed tokens the draft has not seen, then k passes), or
nothing this round (the reason is counted). In hybrid mode the source is chosen per
request and round by predicted speedup S = E[N](α, k) / (1 + σ + k·cost) from that
source's measured acceptance for the request and its measured cost
(``speedup.choose_source``). An n-gram proposal is priced after the lookup, by the
acceptance of matches as long as its own (``match_pricing``); with adaptive k its
number of drafts is the optimum at that price, up to what the lookup found.
A draft-model plan is priced with the catch-up of its lagging draft KV, spread over
the rounds the request has left (``catch_up``). What a round feeds is chunked under a
per-round budget: ``draft_prefill_budget`` tokens, and in a step of several rows at
most what delays it by ``CATCH_UP_STEP_MAX`` plain steps, so a long prompt or a long
lag in a busy batch stalls no step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from vllm_specdec_plugin.catch_up import OutputLengths, round_cost
from vllm_specdec_plugin.config import SpecDecConfig
from vllm_specdec_plugin.kv import BlockAllocator
from vllm_specdec_plugin.match_pricing import MatchKey, lookup_alpha, match_key
from vllm_specdec_plugin.ngram import NGramConfig, NGramIndex
from vllm_specdec_plugin.ngram_corpus import CorpusIndex
from vllm_specdec_plugin.request_state import RequestState, truncate
from vllm_specdec_plugin.speedup import best_k, choose_source
from vllm_specdec_plugin.tenancy import ScopedCorpus, ScopedStore
from vllm_specdec_plugin.tuning import MIN_GAIN


@dataclass(slots=True)
class Plan:
    """One request's work in this round."""

    row: int                # row in the runner's batch
    req_id: str
    req: RequestState
    new_tokens: list[int]   # committed tokens to feed (this round's chunk)
    length: int             # committed length L
    k: int                  # drafts wanted this round (0: prefill chunk only)
    spec: Any = None        # SamplingSpec of a sampled request drafting from q, else None
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    grammar: Any = None     # structured output: the request's grammar copy (masks drafts)
    alpha: float | None = None  # predicted acceptance of these drafts (None: unpriced)
    match: MatchKey | None = None  # n-gram drafts: the bucket of the match they came from
    catch_up: float = 0.0   # draft-model plan: its catch-up's share, plain steps (``catch_up``)

    @property
    def cached(self) -> int:
        """Position of the first token fed this round."""
        return len(self.req.tokens)


# (k, reason-if-0) per request id, per draft source, from the adaptive controllers
Choices = dict[str, dict[str, tuple[int, str]]]
# per draft source: (α of a request id, cost of one draft token in plain steps,
# fixed cost σ of a verifying step in plain steps). The n-gram source's α also takes
# the match bucket of a proposal: alpha(req_id, match); alpha(req_id) is the request's.
Estimates = dict[str, tuple[Callable[..., float], float, float]]


class Planner:
    """Decides each request's round; owns no state beyond the requests it is given."""

    def __init__(self, config: SpecDecConfig, max_model_len: int,
                 allocator: BlockAllocator | None, no_draft: Callable[[str], None]):
        self.config = config
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.allocator = allocator
        self.no_draft = no_draft  # counts a request-round without drafts, by reason
        # plain steps a committed token fed to the draft costs this step's B rows
        # (``catch_up``; the proposer sets it each step, 0 unmeasured)
        self.catch_up_price = 0.0
        # committed tokens a round may feed before it delays the step's rows by more
        # than CATCH_UP_STEP_MAX plain steps (``StepCost.catch_up_room``; None: unbounded)
        self.catch_up_room: int | None = None
        self.outputs = ScopedStore(OutputLengths)  # finished outputs per scope (the caller adds)
        self.uses_model = config.method in ("draft", "hybrid")
        self.uses_ngram = config.method in ("ngram", "hybrid")
        # finished requests' histories, matched within a request's scope (``tenancy``;
        # the caller adds them)
        self.corpus: ScopedCorpus | None = None
        if self.uses_ngram and config.ngram_corpus_tokens and config.ngram_corpus_scope != "off":
            size, n = config.ngram_corpus_tokens, config.ngram_max_n
            min_n = min(config.ngram_corpus_min_n, n)
            self.corpus = ScopedCorpus(size, lambda: CorpusIndex(size, n, min_n,
                                                                 config.ngram_min_prob))

    def plan(self, row: int, req_id: str, req: RequestState, length: int,
             committed_row: np.ndarray, choices: Choices,
             estimates: Estimates | None = None, end: int | None = None,
             load_probe: bool = False) -> Plan | None:
        """n-gram drafts now (``drafts`` filled), a model plan, or None (counted).

        estimates: required in hybrid mode (the source choice), ignored otherwise.
        end: the committed length at which the request finishes (prompt + max_tokens;
        None: only max_model_len bounds it). load_probe: a controller's load probe
        step (``AdaptiveK.load_probing``): hybrid keeps its best source even where it
        does not pay, so that the step verifies and the cost fit learns from it.
        """
        req.round_at(length)
        k_room = self._k_room(length, end)
        if k_room <= 0:
            return self._none("length_guard")
        if self.uses_ngram and self.uses_model:
            return self._plan_hybrid(row, req_id, req, length, committed_row, choices,
                                     estimates or {}, k_room, end, load_probe)
        if self.uses_ngram:
            offer = self._ngram_offer(req_id, req, length, committed_row, choices,
                                      estimates or {}, k_room)
            if not isinstance(offer, Plan):
                return self._none(offer)
            offer.row = row
            return offer
        k, reason = _chosen_k(choices, "draft", req_id, self.k, k_room)
        if not k:
            return self._none(reason)
        plan = self._model_plan(row, req_id, req, length, committed_row, k)
        if estimates and "draft" in estimates:
            plan.catch_up = self._catch_up(req, length, end, estimates["draft"][0](req_id), k)
        return plan

    def hold(self, req: RequestState, length: int, reason: str, end: int | None = None) -> None:
        """No drafts this round, without planning (the step as a whole cannot pay):
        counted as ``reason``, or "length_guard" where ``plan`` would have said so."""
        req.round_at(length)
        self._none("length_guard" if self._k_room(length, end) <= 0 else reason)

    def _k_room(self, length: int, end: int | None) -> int:
        """Most drafts a request at committed length L may get: a round emits up to
        k + 1 tokens, and none past ``end`` (max_tokens: vLLM would verify drafts the
        request can never emit) or max_model_len."""
        return min(self.k, self._limit(end) - length - 1)

    def _limit(self, end: int | None) -> int:
        """Committed length a request cannot pass: ``end`` within max_model_len."""
        return self.max_model_len if end is None else min(end, self.max_model_len)

    def _plan_hybrid(self, row: int, req_id: str, req: RequestState, length: int,
                     committed_row: np.ndarray, choices: Choices, estimates: Estimates,
                     k_room: int, end: int | None, load_probe: bool) -> Plan | None:
        """Whichever of n-gram and draft model predicts the larger speedup for this
        request now (n-gram: at the number of drafts it found), or none when adaptive
        and neither pays (outside load probe steps). A draft-model probe (k = 1 for a
        request held for its α) competes like any round: shadow proposals, not
        probes, measure held rows in hybrid mode."""
        candidates: dict[str, tuple[float, int, float, float]] = {}
        offer = self._ngram_offer(req_id, req, length, committed_row, choices, estimates,
                                  k_room)
        if isinstance(offer, Plan):
            _, cost, fixed = estimates["ngram"]
            candidates["ngram"] = (offer.alpha, offer.k, cost, fixed)
        reason = "" if isinstance(offer, Plan) else offer
        k_d, why = _chosen_k(choices, "draft", req_id, self.k, k_room)
        if k_d:
            alpha, cost, fixed = estimates["draft"]
            alpha_d = alpha(req_id)
            once = self._catch_up(req, length, end, alpha_d, k_d)
            candidates["draft"] = (alpha_d, k_d, cost + once / k_d, fixed)
        else:  # the n-gram's reason first: "ngram_miss" tells no match from a priced-out offer
            reason = reason or why
        source, k = choose_source(candidates, MIN_GAIN,
                                  allow_none=self.config.adaptive and not load_probe)
        if source == "ngram":
            offer.row = row
            return offer
        if source == "draft":
            plan = self._model_plan(row, req_id, req, length, committed_row, k)
            plan.alpha, plan.catch_up = alpha_d, once
            return plan
        return self._none("adaptive" if candidates else reason)

    def _ngram_offer(self, req_id: str, req: RequestState, length: int,
                     committed_row: np.ndarray, choices: Choices, estimates: Estimates,
                     k_room: int) -> Plan | str:
        """This round's n-gram drafts (a Plan with ``drafts``, ``alpha``, ``match``;
        its row is set by the caller), or the reason there are none.

        With adaptive k the lookup runs at the most drafts the best price any match
        could get would pay for (``ANY_MATCH``; also for a request the controller
        holds at 0 for its α: a long match may pay where the request's α alone does
        not) and keeps the optimum k at the proposal's price; where that is 0 it keeps
        the controller's k (a probe), if any. The optimum grows with α, so the bound
        drops only drafts no price would keep."""
        k, why = _chosen_k(choices, "ngram", req_id, self.k, k_room)
        adaptive = "ngram" in choices
        if not k and not (adaptive and why == "adaptive"):
            return why
        alpha_of, cost, fixed = estimates.get("ngram", (None, 0.0, 0.0))
        k_look = k
        if adaptive and alpha_of is not None:
            a_any = lookup_alpha(alpha_of, req_id, k, why)
            k_look = max(k, best_k(a_any, cost, k_room, MIN_GAIN, fixed))
        elif adaptive:
            k_look = k_room
        if not k_look:
            return why
        drafts, match = self._ngram_drafts(req, committed_row, length, k_look)
        if not drafts:
            return "ngram_miss"
        alpha = None
        if alpha_of is not None:
            alpha = alpha_of(req_id, match)
            if adaptive:
                k = best_k(alpha, cost, len(drafts), MIN_GAIN, fixed) or k
                if not k:
                    return why
                drafts = drafts[:k]
        return Plan(row=-1, req_id=req_id, req=req, new_tokens=[], length=length,
                    k=len(drafts), drafts=drafts, alpha=alpha, match=match)

    def _catch_up(self, req: RequestState, length: int, end: int | None, alpha: float,
                  k: int) -> float:
        """Plain steps a draft-model round of k drafts pays for the request's lagging
        draft KV (``catch_up.round_cost``), beyond the one token a drafting row feeds."""
        lag = length - len(req.tokens) - 1
        if lag <= 0 or not self.catch_up_price:
            return 0.0
        horizon = self._limit(end) - length
        outputs = self.outputs.peek(req.scope)
        typical = outputs.typical() if outputs is not None else None
        if typical is not None:
            horizon = min(horizon, typical)
        return round_cost(lag, self.catch_up_price, horizon, alpha, k)

    def _model_plan(self, row: int, req_id: str, req: RequestState, length: int,
                    committed_row: np.ndarray, k: int) -> Plan:
        if len(req.tokens) >= length:  # nothing new (cannot happen in vLLM's flow):
            truncate(req, length - 1, self.allocator)  # re-feed the last token for logits
        return Plan(row=row, req_id=req_id, req=req,
                    new_tokens=committed_row[len(req.tokens):length].tolist(),
                    length=length, k=k)

    def fit(self, plans: list[Plan]) -> list[Plan]:
        """Apply the round's feed budget and reserve draft KV; returns the plans that
        run, sorted by k descending (the round runner relies on that order).

        The budget is ``draft_prefill_budget`` tokens, and at most ``catch_up_room``
        (the tokens that delay the step by ``CATCH_UP_STEP_MAX`` plain steps). Smallest
        catch-ups go first. A plan whose catch-up exceeds what is left of the budget
        feeds a chunk and drafts nothing this round; a plan the pool cannot hold
        drafts nothing (both counted).
        """
        budget = self.config.draft_prefill_budget
        if self.catch_up_room is not None:
            budget = min(budget, self.catch_up_room)
        run: list[Plan] = []
        for p in sorted(plans, key=lambda p: len(p.new_tokens)):
            if len(p.new_tokens) > budget:
                if budget <= 0:
                    self._none("prefill_budget")
                    continue
                p.new_tokens, p.k = p.new_tokens[:budget], 0
            need = p.cached + len(p.new_tokens) + max(p.k - 1, 0)
            if not self.allocator.can_reserve(p.req.table, need):
                self._none("pool_full")
                continue
            self.allocator.reserve(p.req.table, need)
            budget -= len(p.new_tokens)
            if p.k == 0:
                self._none("prefill_budget")
            run.append(p)
        run.sort(key=lambda p: -p.k)
        return run

    def shadow_drafts(self, req: RequestState, committed_row: np.ndarray, length: int,
                      k: int, end: int | None = None) -> tuple[list[int], MatchKey | None]:
        """The n-gram drafts (up to ``k``, within the request's room) a round would
        look up now, and their match bucket; nothing is planned or counted (``shadow``)."""
        k = min(k, self._k_room(length, end))
        if k <= 0:
            return [], None
        return self._ngram_drafts(req, committed_row, length, k)

    def _ngram_drafts(self, req: RequestState, committed_row: np.ndarray, length: int,
                      k: int) -> tuple[list[int], MatchKey]:
        """Prompt-lookup drafts over the committed tokens (the index catches up lazily),
        or the continuation of a finished request when that matches a longer context;
        with the bucket of the match they came from."""
        if req.ngram is None:
            c = self.config
            req.ngram = NGramIndex(NGramConfig(c.ngram_max_n, c.ngram_min_n, c.ngram_window,
                                               c.ngram_min_prob))
        if len(req.ngram) < length:
            req.ngram.extend(committed_row[len(req.ngram):length])
        own_n = req.ngram.longest_match()
        corpus = self.corpus.get(req.scope) if self.corpus is not None else None
        if corpus is not None:
            drafts, n = corpus.propose(req.ngram.tokens, k)
            room = min(k, n)  # a corpus draft is no longer than its match
            if drafts and n > own_n:
                if len(drafts) < room:
                    # The corpus match may sit near the end of its sequence (periodic
                    # text: the newest occurrence is the last), so it offers few tokens.
                    # Where the request's own history proposes the same tokens and more,
                    # both agree on the shared part: take the longer run, within room.
                    own = req.ngram.propose(room)
                    if len(own) > len(drafts) and own[:len(drafts)] == drafts:
                        return own, match_key("corpus", n)
                return drafts, match_key("corpus", n)
        return req.ngram.propose(k), match_key("own", own_n)

    def _none(self, reason: str) -> None:
        self.no_draft(reason)
        return None


def _chosen_k(choices: Choices, source: str, req_id: str, k: int, k_room: int) -> tuple[int, str]:
    """(k, reason-if-0) for a source: the controller's choice, or the fixed k."""
    if source in choices:
        chosen, reason = choices[source].get(req_id, (k, ""))
        return min(chosen, k_room), reason
    return k_room, ""
