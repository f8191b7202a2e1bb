"""DraftModelProposer: the draft side, as a vLLM ``custom_class`` proposer (lifecycle
and orchestration; docs/design.md maps the rest).

vLLM calls ``propose`` each step after the target verified the previous drafts. It
times the step (``step_record``, into ``control.cost``); books what verification taught
and rolls draft KV back (``request_state``); collects each row's offers (``planning``)
for one ``control.policy.decide``; runs the draft-model plans as one batched round
(``draft/``) and hands q to the rejection sampler; and gives a few rows that verify no
n-gram drafts a shadow proposal (``shadow``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import numpy as np
import torch

from vllm_specdec_plugin import draft_vocab
from vllm_specdec_plugin.compat import draft_model, patches, runner_hooks, scheduler
from vllm_specdec_plugin.compat.draft_grammar import DraftGrammars
from vllm_specdec_plugin.config import SpecDecConfig, from_vllm_config, resolve_dtype
from vllm_specdec_plugin.control.acceptance import Acceptance, ScopeRecord
from vllm_specdec_plugin.control.cost import StepCost
from vllm_specdec_plugin.control.policy import (Hint, PlanningCost, ProbeSchedule, StepView,
                                                decide)
from vllm_specdec_plugin.draft.batch import DraftBatch
from vllm_specdec_plugin.draft.checks import check_draft_compatible, resolve_draft_path
from vllm_specdec_plugin.draft.setup import load_draft, log_vocab_buffers
from vllm_specdec_plugin.kv import BlockAllocator
from vllm_specdec_plugin.metrics import ProposerMetrics
from vllm_specdec_plugin.planning import Plan, Planner
from vllm_specdec_plugin.request_state import (RequestState, book_verification, commit_round,
                                               keep_scheduled)
from vllm_specdec_plugin.row_inputs import end_of, grammar_for, is_sampled
from vllm_specdec_plugin.shadow import ShadowBook
from vllm_specdec_plugin.startup_checks import check_features
from vllm_specdec_plugin.stats import ProposerStats
from vllm_specdec_plugin.step_record import StepRecorder
from vllm_specdec_plugin.tenancy import RequestScopes, ScopedStore
from vllm_specdec_plugin.token_draw import SeedStreams
from vllm_specdec_plugin.tuning import CREDIT_MAX, TOKENIZER_PROBE

# A child of "vllm" so records reach the handler vLLM configures (same format, same level).
logger = logging.getLogger("vllm.specdec_plugin")


class DraftModelProposer:
    """A vLLM ``custom_class`` proposer running a draft LM on its own paged KV cache."""

    _specdec_lifecycle = True  # marker read by compat.runner_hooks

    def __init__(self, vllm_config: Any):
        self.vllm_config = vllm_config
        self.config: SpecDecConfig = from_vllm_config(vllm_config)
        check_features(vllm_config)  # engines built without our config wrapper
        c = self.config
        self.k = c.num_speculative_tokens
        mc = vllm_config.model_config
        self.max_model_len = int(mc.max_model_len)
        self.uses_model = c.method in ("draft", "hybrid")
        self.draft_path = None
        self.vocab_size = int(getattr(mc.hf_config, "vocab_size", 0) or 0)
        if self.uses_model:
            self.draft_path = resolve_draft_path(c.draft_model)
            self.draft_hf_config = check_draft_compatible(
                self.draft_path, mc.hf_config, mc.tokenizer, mc.model, self.max_model_len,
                TOKENIZER_PROBE)
            self.vocab_size = int(self.draft_hf_config["vocab_size"])
        # a reduced draft vocabulary, read now: a bad file fails early
        self.draft_vocab = (draft_vocab.load(c.draft_vocab, self.vocab_size)
                            if self.uses_model and c.draft_vocab else None)
        self.cost = StepCost()  # the step's cost fits (``control.cost``)
        self.planning_cost = PlanningCost() if c.adaptive and c.method != "draft" else None
        self.probes = ProbeSchedule()
        self.scopes = RequestScopes(c.ngram_corpus_scope)  # salts, aborts
        self.scope_records = ScopedStore(ScopeRecord)  # what a scope's requests share
        self.dtype_name = resolve_dtype(mc.dtype)
        self.dtype = getattr(torch, self.dtype_name)
        self.kernels: draft_model.DraftKernels | None = None
        self.ready = False  # load_model() ran
        self.allocator: BlockAllocator | None = None
        budget = int(getattr(vllm_config.scheduler_config, "max_num_batched_tokens", 0) or 2048)
        self.planner = Planner(c.method, self.k, self.max_model_len, c.ngram_corpus_tokens,
                               c.ngram_corpus_scope, budget, self._no_draft)
        self.device = torch.device("cpu")
        self.runner: Any = None
        self.requests: dict[str, RequestState] = {}
        self.grammars = DraftGrammars(vllm_config)  # structured output: masks the drafts
        self.stats = ProposerStats()
        self._step_no_draft: Counter[str] = Counter()  # this step's no-draft rounds, by reason
        self.next_prefill = 0  # prompt tokens the next step carries (the scheduler's view)
        self.hint: Hint | None = None  # the last decision, as the scheduler applies it
        self.metrics = ProposerMetrics(str(getattr(mc, "served_model_name", None) or mc.model))
        # seeded requests' noise, as vLLM draws it: verification and drafts read it alike
        self.seed_streams = SeedStreams()
        self.rounds = DraftBatch(self.grammars, self.vocab_size, self.stats, self.metrics,
                                 self.cost, self.seed_streams)
        self.steps = StepRecorder(self.cost, self.metrics, c.tpot_limit)
        self.shadows = ShadowBook(self.planner.shadow_drafts, self.stats, self.metrics) \
            if self.planner.uses_ngram else None
        # Only now, when the user selected this proposer: GPUModelRunner.__init__ builds
        # its rejection sampler and input batch right after constructing us.
        patches.install("worker")

    @property
    def model(self) -> torch.nn.Module | None:  # the draft's vLLM model
        return self.kernels.model if self.kernels else None

    # ------------------------------------------------------------------ set-up

    def load_model(self, target_model: Any = None) -> None:
        """Load the draft through vLLM, allocate its KV pool, warm (compile) it: inside the
        runner's load_model, before vLLM sizes the target's KV cache (on GPU the draft's
        weights and pool come out of the target's budget)."""
        p = next(iter(target_model.parameters()), None) if target_model is not None else None
        self.device = p.device if p is not None else torch.device("cpu")
        self.ready = True
        log_vocab_buffers(self.vllm_config, self.k, self.vocab_size, self.uses_model)
        c = self.config
        logger.info("specdec: method %s, k %s %d, tpot_limit %g, ttft_limit %g", c.method,
                    "up to" if c.adaptive else "always", self.k, c.tpot_limit, c.ttft_limit)
        if not self.uses_model:
            return
        self.kernels, self.allocator = load_draft(
            self.vllm_config, self.config, self.draft_path, self.draft_hf_config, self.dtype,
            self.dtype_name, self.device, self.max_model_len, self.vocab_size, self.draft_vocab)
        self.planner.allocator = self.allocator
        self.metrics.kv_blocks(0, self.allocator.num_blocks)

    def bind_runner(self, runner: Any) -> None:
        self.runner = runner
        runner_hooks.bind_sampler(runner)

    # --------------------------------------------------------------- lifecycle

    def on_scheduler_output(self, scheduler_output: Any) -> None:
        """Free draft blocks of finished, aborted and preempted requests."""
        # The step's target work runs between now and the propose() call that ends it.
        scheduled = runner_hooks.num_scheduled_tokens(scheduler_output)
        self.steps.begin(scheduled)
        self.next_prefill = scheduler.read_next_prefill(scheduler_output)
        spec = runner_hooks.scheduled_spec_tokens(scheduler_output)
        if spec is not None and scheduled:  # drafts cut before verification are not booked
            for rid in scheduled:
                req = self.requests.get(rid)
                if req is not None and req.drafted:
                    keep_scheduled(req, len(spec.get(rid, ())), self.allocator)
        if self.scopes.note(scheduler.read_scope(scheduler_output)):
            logger.warning("specdec: the engine process reports no cache_salt or aborts "
                           "(is the plugin registered there?); requests share no "
                           "n-gram corpus or statistics")
        corpus = self.planner.corpus
        for rid in runner_hooks.finished_req_ids(scheduler_output):
            req = self.requests.pop(rid, None)
            scope, share = self.scopes.finish(rid)
            if corpus is not None and self.runner is not None and share:
                tokens = runner_hooks.committed_tokens(self.runner, rid)
                if tokens is not None:
                    corpus.add(scope, tokens)
            if req is not None:
                self._release(req)
                if req.output_tokens > 0:
                    req.learned.scope.outputs.append(req.output_tokens)
                self.metrics.request_finished(req.acceptance.drafted, req.acceptance.accepted)
                self.grammars.forget(rid)
            self.seed_streams.forget(rid)
        for rid in runner_hooks.preempted_req_ids(scheduler_output):
            req = self.requests.get(rid)
            if req is not None:  # resumed later: re-prefilled lazily
                self._release(req)
                req.reset_for_prefill()
        if self.allocator is not None:  # idle servers step once more to free: keep the gauge true
            self.metrics.kv_blocks(self.allocator.num_used, self.allocator.num_blocks)

    def _release(self, req: RequestState) -> None:
        if self.allocator is not None:
            self.allocator.release(req.table)

    # ----------------------------------------------------------------- propose

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        """Per row of the runner's batch, its draft token ids (maybe none).

        sampled_token_ids: per row, the tokens emitted this step ([] while prefilling);
        num_tokens_no_spec: [max_num_seqs] committed lengths; token_ids_cpu:
        [max_num_seqs, max_model_len] committed tokens (read [:n] only).
        """
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        if self.runner is None or not self.ready:
            return out  # warm-up before the first scheduler output
        req_ids = runner_hooks.batch_req_ids(self.runner)
        saved = self.steps.end(sampled_token_ids, req_ids, self.requests,
                               *runner_hooks.take_exact_sampler(self.runner))
        if self.planning_cost is not None:
            self.planning_cost.book(saved)
        drafted0, accepted0 = self.stats.drafted_by.copy(), self.stats.accepted_by.copy()
        rows = [r for r, sampled in enumerate(sampled_token_ids) if sampled]
        for row in rows:  # book first: this step's offers are priced on what it taught
            req = self._verified(req_ids[row], len(sampled_token_ids[row]) - 1, token_ids_cpu[row])
            if self.shadows is not None:
                self.shadows.book(req, token_ids_cpu[row], int(num_tokens_no_spec[row]))
        self.metrics.verified(self.stats.drafted_by - drafted0, self.stats.accepted_by - accepted0)
        t_plan = time.perf_counter()
        plans, planned = self._decide(rows, req_ids, num_tokens_no_spec, token_ids_cpu)
        model_plans: list[Plan] = []
        ngram_plans: list[Plan] = []
        for plan in plans:
            reason = grammar_for(self.runner, self.grammars, plan, token_ids_cpu[plan.row])
            if reason:
                self._no_draft(reason)
            else:
                (ngram_plans if plan.drafts else model_plans).append(plan)
        for plan in ngram_plans:  # n-gram drafts: ready, point masses
            out[plan.row] = plan.drafts
            commit_round(plan, "ngram", self.stats)
        if model_plans:  # a catch-up delays every row: at most what the time-per-token bound allows a step
            room = self.cost.catch_up_room(len(rows), self.config.tpot_limit - 1.0 + CREDIT_MAX)
            model_plans = self.planner.fit(model_plans, room)
        drafting = [p for p in model_plans if p.k > 0]
        sampler = None
        if model_plans:
            sampler = self.rounds.run(self.runner, self.kernels, self.device, model_plans,
                                      token_ids_cpu)
            for p in drafting:
                out[p.row] = p.drafts
                commit_round(p, "draft", self.stats)
        if drafting or ngram_plans:
            self.rounds.publish(self.runner, self.device, drafting, ngram_plans, sampler)
        if self.shadows is not None and planned:
            self.shadows.propose([r for r in rows if not (out[r] and self.requests[req_ids[r]]
                                                           .source == "ngram")],
                                 req_ids, self.requests, token_ids_cpu, num_tokens_no_spec,
                                 self._end)
        if self.planning_cost is not None and planned and rows:
            self.planning_cost.planned(len(rows), time.perf_counter() - t_plan)
        if any(out):
            self.stats.rounds += 1
        self.metrics.step_done((len(d) for d in out if d), self._step_no_draft,
                               Counter(self.requests[req_ids[r]].source if out[r] else "none"
                                       for r in rows),
                               self._step_no_draft["adaptive"] + self._step_no_draft["batch"])
        self._step_no_draft.clear()
        if self.allocator is not None:
            self.metrics.kv_blocks(self.allocator.num_used, self.allocator.num_blocks)
        return out

    def _decide(self, rows: list[int], req_ids: list[str], lengths: np.ndarray,
                token_ids_cpu: np.ndarray) -> tuple[list[Plan], bool]:
        """The step's plans, from one ``control.policy.decide``, and whether it was planned
        (the host-time term may skip it: rows then decode plainly)."""
        c, batch = self.config, len(rows)
        prices = self.cost.prices(batch)
        share = (c.ttft_limit - 1.0) / 2.0  # a first token waits for two such steps
        room = None
        if self.next_prefill and prices.plain_s:
            with_prompt = self.cost.step_s(batch, self.next_prefill, batch) or prices.plain_s
            room = share * with_prompt / prices.plain_s
        t = self.cost.target
        t.fresh()
        self.hint = Hint(None if t.a is None else (t.a, *t.coef, self.cost.sigma_s(0),
                                                   self.cost.sigma.slope(0)), share, ())
        if not rows:
            return [], False
        if self.planning_cost is not None:
            # A probe of a skipped batch size plans like any step: a draft-model offer
            # whose KV lags pays its catch-up in its price, and a round feeds at most
            # what the time-per-token bound lets a step take.
            room_s = None if room is None else room * prices.plain_s
            if not self.planning_cost.plan(batch, room_s):
                for row in rows:
                    self._hold(req_ids[row], int(lengths[row]), "host_time")
                return [], False
        views, lookups = [], []
        for row in rows:
            req = self.requests[req_ids[row]]
            view, lookup = self.planner.offers(req, int(lengths[row]), token_ids_cpu[row],
                                               self._end(row, req_ids[row]), prices)
            if prices.sampled_position and is_sampled(self.runner, req_ids[row]):
                view.reach = prices.sampled_position
            views.append(view)
            lookups.append(lookup)
        probe = c.adaptive and self.probes.probe()
        decision = decide(StepView(batch, prices.verify, prices.sigma, c.tpot_limit, room,
                                   c.adaptive, probe, prices.prefill), views)
        if c.adaptive:
            self.probes.decided(decision, probe)
        plans = []
        for i, row in enumerate(rows):
            source, k = decision.ks[i]
            if k:
                plans.append(self.planner.plan(row, req_ids[row], self.requests[req_ids[row]],
                                               int(lengths[row]), token_ids_cpu[row], source,
                                               k, lookups[i]))
            else:
                why = decision.why[i]
                if why == "no_offer" or (why == "adaptive" and lookups[i] is not None
                                         and not lookups[i].drafts):
                    # tell a missing match (or no room) from a priced-out offer
                    room_left = self.planner.room(int(lengths[row]), self._end(row, req_ids[row]))
                    why = "ngram_miss" if room_left > 0 else "length_guard"
                self._no_draft(why)
        self.hint = Hint(self.hint.price, share, tuple(req_ids[rows[i]] for i in decision.order))
        return plans, True

    # ------------------------------------------------------------ bookkeeping

    def _verified(self, req_id: str, num_accepted: int, committed_row: np.ndarray) -> RequestState:
        """Book the verification of a request's last drafts (a new request joins)."""
        req = self.requests.get(req_id)
        if req is None:
            scope = self.scopes.get(req_id)
            req = self.requests[req_id] = RequestState(
                scope=scope, learned=Acceptance(self.scope_records.get(scope)))
        book_verification(req, num_accepted, committed_row, self.allocator, self.stats)
        return req

    def _hold(self, req_id: str, length: int, reason: str) -> None:
        """No drafts this round, without planning (counted as ``reason``)."""
        self.requests[req_id].round_at(length)
        self._no_draft(reason)

    def _end(self, row: int, req_id: str) -> int | None:
        return end_of(self.runner, row, req_id)

    def plan_hint(self) -> Hint | None:  # the last decision, for compat.scheduler
        return self.hint

    def _no_draft(self, reason: str) -> None:
        """Count a request-round without drafts (the metrics get the step's counts once)."""
        self.stats.no_draft[reason] += 1
        self._step_no_draft[reason] += 1
