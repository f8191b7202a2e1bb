"""DraftModelProposer: the draft side of speculative decoding, as a vLLM proposer.

Selected with ``--speculative-config '{"method": "custom_class", "model":
"vllm_specdec_plugin.DraftModelProposer", "num_speculative_tokens": K, ...}'``.

Each engine step vLLM calls ``propose`` after the target verified the previous
drafts. For every running request the proposer

1. rolls its draft KV back to the accepted length (``request_state.roll_back``);
2. plans the round (``planning``): n-gram drafts, a draft-model plan, or none; with
   adaptive k the step as a whole must pay its fixed cost (``batch_check``), and
   planning its host time (``host_gate``);
3. runs the draft-model plans as one batched round (``draft/batch.py``, ``round.py``): the
   committed tokens the draft has not seen (lazy prefill, chunked under a budget),
   then k-1 decode passes, on vLLM's model class and attention backend over the
   plugin's own KV (``compat/draft_model.py``);
4. hands q to the rejection sampler (``draft_probs``);
5. gives a few rows that verify no n-gram drafts a shadow proposal, measured by the
   tokens the target commits next (``shadow``).

Here: lifecycle and orchestration. Each step is timed (``step_record``) into the
cost model (``step_cost``); the module map in docs/design.md names the rest.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from functools import partial
from typing import Any

import numpy as np
import torch

from vllm_specdec_plugin import batch_check, draft_vocab
from vllm_specdec_plugin.adaptive import AdaptiveK, controllers_for
from vllm_specdec_plugin.compat import (draft_ids_return, draft_model, rejection_adapter,
                                        request_scope, runner_hooks)
from vllm_specdec_plugin.compat.draft_grammar import DraftGrammars
from vllm_specdec_plugin.config import SpecDecConfig, from_vllm_config, resolve_dtype
from vllm_specdec_plugin.draft.checks import check_draft_compatible, resolve_draft_path
from vllm_specdec_plugin.draft.batch import DraftBatch
from vllm_specdec_plugin.draft.setup import load_draft, log_vocab_buffers
from vllm_specdec_plugin.host_gate import HostGate
from vllm_specdec_plugin.kv import BlockAllocator
from vllm_specdec_plugin.match_pricing import MatchAlpha, proposal_alpha
from vllm_specdec_plugin.metrics import ProposerMetrics
from vllm_specdec_plugin.planning import Plan, Planner
from vllm_specdec_plugin.request_state import (RequestState, book_verification, commit_round,
                                               keep_scheduled)
from vllm_specdec_plugin.row_inputs import end_of, grammar_for
from vllm_specdec_plugin.shadow import ShadowBook
from vllm_specdec_plugin.startup_checks import check_features
from vllm_specdec_plugin.stats import ProposerStats, RequestAcceptance
from vllm_specdec_plugin.plan_hint import plan_hint
from vllm_specdec_plugin.step_cost import StepCost
from vllm_specdec_plugin.step_record import StepRecorder
from vllm_specdec_plugin.tenancy import RequestScopes, ScopedStore

# A child of "vllm" so records reach the handler vLLM configures (same format, same level).
logger = logging.getLogger("vllm.specdec_plugin")


class DraftModelProposer:
    """A vLLM ``custom_class`` proposer running a draft LM on its own paged KV cache."""

    _specdec_lifecycle = True  # marker read by compat.runner_hooks

    def __init__(self, vllm_config: Any):
        self.vllm_config = vllm_config
        self.config: SpecDecConfig = from_vllm_config(vllm_config)
        check_features(vllm_config)  # engines built without our config wrapper
        self.k = self.config.num_speculative_tokens
        mc = vllm_config.model_config
        self.max_model_len = int(mc.max_model_len)
        self.uses_model = self.config.method in ("draft", "hybrid")
        self.draft_path = None
        self.vocab_size = int(getattr(mc.hf_config, "vocab_size", 0) or 0)
        if self.uses_model:
            self.draft_path = resolve_draft_path(self.config.draft_model)
            self.draft_hf_config = check_draft_compatible(
                self.draft_path, mc.hf_config, mc.tokenizer, mc.model, self.max_model_len,
                self.config.tokenizer_probe)
            self.vocab_size = int(self.draft_hf_config["vocab_size"])
        # a reduced draft vocabulary, read now so that a bad file fails early
        self.draft_vocab = (draft_vocab.load(self.config.draft_vocab, self.vocab_size)
                            if self.uses_model and self.config.draft_vocab else None)
        # the whole step's cost model, fitted from every step (``step_cost``)
        self.step_cost = StepCost()
        # One controller per draft source (adaptive k, and hybrid's choice of source)
        self.controllers: dict[str, AdaptiveK] = {}
        if self.config.adaptive or self.config.method == "hybrid":
            sources = (["draft"] if self.uses_model else []) + \
                (["ngram"] if self.config.method in ("ngram", "hybrid") else [])
            self.controllers = controllers_for(sources, self.k, self.config.adaptive_prior_alpha,
                                               self.step_cost)
        # n-gram proposals are priced by the acceptance of matches as long as theirs,
        # learned per tenant scope like everything else learned from text (``tenancy``)
        self.match_alpha = ScopedStore(MatchAlpha) if "ngram" in self.controllers else None
        self.ngram_alpha = partial(proposal_alpha, self.controllers["ngram"], self.match_alpha) \
            if self.match_alpha is not None else None  # (req_id, match=None) -> α
        self.scopes = RequestScopes(self.config.ngram_corpus_scope)  # salts, aborts
        self.dtype_name = resolve_dtype(self.config.draft_dtype, mc.dtype)
        self.dtype = getattr(torch, self.dtype_name)
        self.kernels: draft_model.DraftKernels | None = None
        self.ready = False  # load_model() ran
        self.allocator: BlockAllocator | None = None
        self.planner = Planner(self.config, self.max_model_len, None, self._no_draft)
        self.device = torch.device("cpu")
        self.runner: Any = None
        self.requests: dict[str, RequestState] = {}
        self.grammars = DraftGrammars(vllm_config)  # structured output: masks the drafts
        self.stats = ProposerStats()
        self._step_no_draft: Counter[str] = Counter()  # this step's no-draft rounds, by reason
        self.prompts_next = False  # the step plan: the next step carries a prompt
        self.metrics = ProposerMetrics(str(getattr(mc, "served_model_name", None) or mc.model))
        self.rounds = DraftBatch(self.config.draft_sampling, self.grammars, self.vocab_size,
                                 self.stats, self.metrics, self.step_cost)
        self.steps = StepRecorder(self.step_cost, self.metrics, self.config.row_slack)
        # adaptive: plan only where verification saves more than planning costs the host
        self.gate = HostGate() if self.config.adaptive and self.config.host_gate \
            and "ngram" in self.controllers else None
        self.shadows = ShadowBook(self.controllers["ngram"], self.match_alpha,
                                  self.planner.shadow_drafts, self.stats, self.metrics) \
            if self.match_alpha is not None else None
        # Only now, when the user selected this proposer: GPUModelRunner.__init__ builds
        # its rejection sampler and input batch right after constructing us.
        runner_hooks.install()
        rejection_adapter.install_worker_patches()
        draft_ids_return.install_worker()  # drafts return with the step's output
        draft_ids_return.install_engine()  # in-process engines (no-op in a worker process)

    @property
    def model(self) -> torch.nn.Module | None:
        """The draft's vLLM model (an nn.Module), or None without a draft model."""
        return self.kernels.model if self.kernels else None

    # ------------------------------------------------------------------ set-up

    def load_model(self, target_model: Any = None) -> None:
        """Load the draft through vLLM, allocate its KV pool, warm (compile) it.

        Runs inside the runner's load_model, before vLLM sizes the target's KV cache,
        so on GPU the draft weights and pool are subtracted from the target's budget.
        """
        p = next(iter(target_model.parameters()), None) if target_model is not None else None
        self.device = p.device if p is not None else torch.device("cpu")
        self.ready = True
        log_vocab_buffers(self.vllm_config, self.k, self.vocab_size, self.uses_model)
        if not self.uses_model:
            c = self.config
            logger.info("specdec: n-gram drafting (max_n %d, min_n %d, window %d, min_prob %g); "
                        "no draft model", c.ngram_max_n, c.ngram_min_n, c.ngram_window,
                        c.ngram_min_prob)
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
        # the next step carries a prompt: a draft round now would only delay it
        self.prompts_next = runner_hooks.prompts_next(scheduler_output)
        spec = runner_hooks.scheduled_spec_tokens(scheduler_output)
        if spec is not None and scheduled:  # drafts cut before verification are not booked
            for rid in scheduled:
                req = self.requests.get(rid)
                if req is not None and req.drafted:
                    keep_scheduled(req, len(spec.get(rid, ())), self.allocator)
        if self.scopes.note(request_scope.read(scheduler_output)):
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
                self.planner.outputs.get(req.scope).add(req.output_tokens)
                self.metrics.request_finished(req.acceptance.drafted, req.acceptance.accepted)
                for c in self.controllers.values():
                    c.forget(rid)
                self.grammars.forget(rid)
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

    def request_acceptance(self, req_id: str) -> RequestAcceptance | None:
        req = self.requests.get(req_id)
        return req.acceptance if req else None

    # ----------------------------------------------------------------- propose

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        """Draft tokens for every row of the runner's batch.

        sampled_token_ids: per row, tokens the target emitted this step ([] while a
          prompt is still being prefilled in chunks).
        num_tokens_no_spec: [max_num_seqs] committed length per row.
        token_ids_cpu: [max_num_seqs, max_model_len] committed tokens (read [:n] only).
        Returns per row a list of draft token ids (possibly empty).
        """
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        if self.runner is None or not self.ready:
            return out  # warm-up before the first scheduler output
        req_ids = runner_hooks.batch_req_ids(self.runner)
        saved = self.steps.end(sampled_token_ids, req_ids, self.requests,
                               runner_hooks.take_exact_sampler_seconds(self.runner))
        if self.gate is not None:
            self.gate.book(saved)
        drafted0, accepted0 = self.stats.drafted, self.stats.accepted
        rows = [r for r, sampled in enumerate(sampled_token_ids) if sampled]
        for row in rows:  # roll back first: the controllers learn from this verification
            self._verified(req_ids[row], len(sampled_token_ids[row]) - 1, token_ids_cpu[row])
            if self.shadows is not None:
                self.shadows.book(req_ids[row], self.requests[req_ids[row]], token_ids_cpu[row],
                                  int(num_tokens_no_spec[row]))
        self.metrics.verified(self.stats.drafted - drafted0, self.stats.accepted - accepted0)
        batch = len(rows)
        # host_gate: at this batch size planning has cost more host time than it saved
        skip = self.gate is not None and not self.prompts_next and not self.gate.plan(batch)
        t_plan = time.perf_counter()
        choices = {}
        # a host gate probe plans n-gram drafts only (the draft KV lags: ``host_gate``)
        gate_probe = self.gate is not None and not (skip or self.prompts_next) and self.gate.probing
        for src, c in self.controllers.items():
            if self.config.adaptive and not skip:
                choices[src] = c.choose([req_ids[r] for r in rows], batch)
            else:
                c.begin_step()
        active = [c for src, c in self.controllers.items() if not (gate_probe and src == "draft")]
        if gate_probe and "draft" in choices:
            choices["draft"] = dict.fromkeys(choices["draft"], (0, "host_time"))
        backed_off0 = self.stats.backed_off
        probing = any(c.probing for c in active)
        load_probe = any(c.load_probing for c in active)
        if self.prompts_next or skip:  # nothing is priced: the step plans no drafts
            held = dict.fromkeys((req_ids[r] for r in rows), "host_time" if skip else "prompt_next")
        else:
            estimates = {src: (self.ngram_alpha if src == "ngram" else c.alpha,
                               c.cost_per_draft(batch), c.fixed_cost(batch))
                         for src, c in self.controllers.items()}
            if self.uses_model:  # a token fed to the draft delays all rows
                self.planner.catch_up_price = batch * self.step_cost.catch_up_cost(batch)
                self.planner.catch_up_room = self.step_cost.catch_up_room(batch)
            held = batch_check.held([req_ids[r] for r in rows], batch, choices, estimates,
                                    self.k, probing, self.config.step_min_gain) \
                if self.config.adaptive else None
        if held is not None:  # no plan could pay, a prompt comes next, or the gate: no plans
            plans = []
            for row in rows:
                self.planner.hold(self.requests[req_ids[row]], int(num_tokens_no_spec[row]),
                                  held[req_ids[row]], self._end(row, req_ids[row]))
        else:
            plans = [p for p in (self.planner.plan(row, req_ids[row], self.requests[req_ids[row]],
                                                   int(num_tokens_no_spec[row]), token_ids_cpu[row],
                                                   choices, estimates, self._end(row, req_ids[row]),
                                                   load_probe)
                                 for row in rows) if p]
            if self.config.adaptive:  # no row loses > row_slack, and what is left pays
                plans, cut, unpaid = batch_check.check(
                    plans, batch, estimates, probing, self.config.row_slack,
                    self.config.step_min_gain, [self.requests[req_ids[r]] for r in rows])
                for reason, n in (("slows_others", cut), ("batch", unpaid)):
                    for _ in range(n):
                        self._no_draft(reason)
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
        model_plans = self.planner.fit(model_plans) if model_plans else []
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
        if self.shadows is not None and not skip:
            self.shadows.propose([r for r in rows if not (out[r] and self.requests[req_ids[r]]
                                                           .source == "ngram")],
                                 req_ids, self.requests, token_ids_cpu, num_tokens_no_spec,
                                 self._end)
        if self.gate is not None and not (self.prompts_next or skip) and rows:
            self.gate.planned(batch, time.perf_counter() - t_plan)
        verifies = any(out)
        if verifies:
            self.stats.rounds += 1
        if self.config.adaptive and not skip:  # after every cut (batch check, grammar, pool): the truth
            for c in self.controllers.values():
                c.step_verifies(verifies)
        self.metrics.step_done((len(d) for d in out if d), self._step_no_draft,
                               Counter(self.requests[req_ids[r]].source if out[r] else "none"
                                       for r in rows),
                               self.stats.backed_off - backed_off0)
        self._step_no_draft.clear()
        if self.allocator is not None:
            self.metrics.kv_blocks(self.allocator.num_used, self.allocator.num_blocks)
        return out

    # ------------------------------------------------------------ bookkeeping

    def _verified(self, req_id: str, num_accepted: int, committed_row: np.ndarray) -> None:
        """Book the verification of a request's last drafts (a new request joins)."""
        req = self.requests.get(req_id)
        if req is None:
            req = self.requests[req_id] = RequestState(scope=self.scopes.get(req_id))
            for c in self.controllers.values():
                c.join(req_id, req.scope)
        book_verification(req, req_id, num_accepted, committed_row, self.controllers,
                          self.match_alpha, self.allocator, self.stats)

    def _end(self, row: int, req_id: str) -> int | None:
        return end_of(self.runner, row, req_id)

    def plan_hint(self) -> tuple | None:
        """For the scheduler's step plan, with this step's drafts (``plan_hint``);
        None with ``step_plan`` off (the scheduler then plans nothing)."""
        return plan_hint(self) if self.config.step_plan else None

    def _no_draft(self, reason: str) -> None:
        """Count a request-round decoded without drafts (k = 0 this round); the metrics
        get the step's counts once, at the end of propose()."""
        self.stats.no_draft[reason] += 1
        self._step_no_draft[reason] += 1
