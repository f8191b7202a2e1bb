"""DraftModelProposer: the draft side of speculative decoding, as a vLLM proposer.

Selected with ``--speculative-config '{"method": "custom_class", "model":
"vllm_specdec_plugin.DraftModelProposer", "num_speculative_tokens": K, ...}'``.

Each engine step vLLM calls ``propose`` after the target verified the previous
drafts. For every running request the proposer

1. rolls its draft KV back to the accepted length (``request_state.roll_back``);
2. plans the round (``planning``): n-gram drafts (from the request's own tokens or
   from finished requests'), a draft-model plan, or none; with adaptive k, the step as
   a whole must pay a verifying step's fixed cost, else no row drafts;
3. runs the draft-model plans as one batched round (``draft/round.py``): the
   committed tokens the draft has not seen (lazy prefill, chunked under a budget),
   then k-1 decode passes, on vLLM's model class and attention backend over the
   plugin's own KV (``compat/draft_model.py``);
4. hands q to the rejection sampler (``draft_probs``);
5. gives a few rows that verify no n-gram drafts a shadow proposal, measured by the
   tokens the target commits next (``shadow``).

Where each job lives: lifecycle and orchestration here; request state and rollback
in ``request_state``; planning and the prefill budget in ``planning``; the passes in
``draft/round.py``; draft sampling and q in ``draft/sampler.py``; adaptive k in
``adaptive``; metrics in ``metrics``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import numpy as np
import torch

from vllm_specdec_plugin import draft_probs
from vllm_specdec_plugin.adaptive import (AdaptiveConfig, AdaptiveK, batch_pays,
                                          best_net_gain, step_may_pay)
from vllm_specdec_plugin.compat import (draft_ids_return, draft_model, rejection_adapter,
                                        request_scope, runner_hooks)
from vllm_specdec_plugin.compat.draft_grammar import DraftGrammars, is_structured
from vllm_specdec_plugin.config import SpecDecConfig, from_vllm_config, resolve_dtype
from vllm_specdec_plugin.draft.checks import (check_draft_budget, check_draft_compatible,
                                              resolve_draft_path)
from vllm_specdec_plugin.draft.round import run_round
from vllm_specdec_plugin.draft.sampler import DraftSampler
from vllm_specdec_plugin.kv import BlockAllocator
from vllm_specdec_plugin.match_pricing import ANY_MATCH, MatchAlpha, MatchKey
from vllm_specdec_plugin.metrics import ProposerMetrics
from vllm_specdec_plugin.planning import Plan, Planner
from vllm_specdec_plugin.request_state import RequestState, roll_back
from vllm_specdec_plugin.sampling.pipeline import SamplingSpec
from vllm_specdec_plugin.shadow import SHADOW_K, Shadow, take_turns
from vllm_specdec_plugin.startup_checks import check_features
from vllm_specdec_plugin.stats import ProposerStats, RequestAcceptance
from vllm_specdec_plugin.tenancy import ScopedStore, scope_key
from vllm_specdec_plugin.vocab_memory import describe as describe_buffers
from vllm_specdec_plugin.vocab_memory import vocab_buffers

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
        # One controller per draft source (adaptive k, and hybrid's choice of source):
        # each measures its source's acceptance per request and its cost; the n-gram
        # source costs no draft time, so only the verify cost limits it.
        self.controllers: dict[str, AdaptiveK] = {}
        if self.config.adaptive or self.config.method == "hybrid":
            sources = (["draft"] if self.uses_model else []) + \
                (["ngram"] if self.config.method in ("ngram", "hybrid") else [])
            for source in sources:
                # the n-gram source needs no probes: shadow proposals (``shadow``)
                # measure held rows' n-gram acceptance at no target cost
                self.controllers[source] = AdaptiveK(AdaptiveConfig(
                    k_max=self.k, prior_alpha=self.config.adaptive_prior_alpha,
                    c_prime_default=0.05 if source == "draft" else 0.0,
                    **({} if source == "draft" else {"probe_every": 0})))
        # n-gram proposals are priced by the acceptance of matches as long as theirs,
        # learned per tenant scope like everything else learned from text (``tenancy``)
        self.match_alpha = ScopedStore(MatchAlpha) if "ngram" in self.controllers else None
        self._scopes: dict[str, Any] = {}  # req_id -> tenancy scope key, until it finishes
        self._aborted: set[str] = set()  # aborted ids not yet seen finishing
        self._scopes_reported = True  # the engine process attaches salts and aborts
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
        self.draft_seconds = 0.0   # wall time spent in draft rounds (for c')
        self.draft_forwards = 0
        self.metrics = ProposerMetrics(str(getattr(mc, "served_model_name", None) or mc.model))
        self._step_t0: float | None = None  # when the current engine step began
        self._shadow_turn = 0  # rotates which rows get new shadow proposals
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
        max_rows = int(getattr(self.vllm_config.scheduler_config, "max_num_seqs", 0) or 0)
        vocab = vocab_buffers(max_rows, self.k, self.vocab_size,
                              torch.empty((), dtype=self.vllm_config.model_config.dtype).element_size(),
                              self.uses_model)
        logger.info("specdec: per-step vocabulary buffers at %d requests x k %d x V %d: %s",
                    max_rows, self.k, self.vocab_size, describe_buffers(vocab))
        if not self.uses_model:
            logger.info("specdec: n-gram drafting (max_n %d, min_n %d, window %d); no draft model",
                        self.config.ngram_max_n, self.config.ngram_min_n, self.config.ngram_window)
            return
        bs = self.config.block_size
        num_blocks = check_draft_budget(self.draft_hf_config, self.dtype_name, bs,
                                        self.config.draft_kv_cache_mib, self.max_model_len)
        t0 = time.perf_counter()
        self.kernels = draft_model.load(self.vllm_config, self.draft_path, bs, num_blocks,
                                        self.dtype, self.device)
        self.allocator = BlockAllocator(self.kernels.num_blocks, bs)
        self.planner.allocator = self.allocator
        self.metrics.kv_blocks(0, self.allocator.num_blocks)
        weights = sum(t.numel() * t.element_size() for t in self.model.parameters())
        self._warm_up()
        logger.info(
            "specdec: draft %s (%s, %s) on %s, backend %s, %s; weights %.1f MiB, draft KV "
            "%d blocks x %d tokens = %.1f MiB (reserved before the target's KV is sized); "
            "loaded and warmed in %.1f s", self.draft_path, type(self.model).__name__,
            str(self.dtype).removeprefix("torch."), self.device, self.kernels.backend_name,
            "compiled" if self.kernels.compiled else "eager", weights / 2**20,
            self.allocator.num_blocks, bs, self.kernels.kv_bytes / 2**20,
            time.perf_counter() - t0)

    def _warm_up(self) -> None:
        """Run a varlen pass and a decode pass so torch.compile compiles now, in
        load_model, never while serving. Writes only free blocks (nothing is cached)."""
        bs, n = self.config.block_size, self.allocator.num_blocks
        rows = []
        for length, k in ((min(2 * bs + 3, self.max_model_len - 3), 2), (1, 2)):
            req = RequestState()
            req.table.blocks = [i % n for i in range(-(-(length + k) // bs))]
            rows.append(Plan(row=0, req_id="warmup", req=req, new_tokens=[0] * length,
                             length=length, k=k))
        sampler = DraftSampler([None, None], [[], []], [[], []], [None, None], 2,
                               self.vocab_size, self.device)
        run_round(self.kernels, rows, sampler, self.device)

    def bind_runner(self, runner: Any) -> None:
        self.runner = runner
        runner_hooks.bind_sampler(runner)

    # --------------------------------------------------------------- lifecycle

    def on_scheduler_output(self, scheduler_output: Any) -> None:
        """Free draft blocks of finished, aborted and preempted requests."""
        # The step's target work runs between now and the propose() call that ends it.
        self._step_t0 = time.perf_counter()
        self._read_scopes(scheduler_output)
        corpus = self.planner.corpus
        for rid in runner_hooks.finished_req_ids(scheduler_output):
            req = self.requests.pop(rid, None)
            scope = self._scopes.pop(rid, None)
            aborted = rid in self._aborted
            self._aborted.discard(rid)
            if corpus is not None and self.runner is not None and not aborted \
                    and self._scopes_reported:
                tokens = runner_hooks.committed_tokens(self.runner, rid)
                if tokens is not None:
                    corpus.add(scope, tokens)
            if req is not None:
                self._release(req)
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

    def _read_scopes(self, scheduler_output: Any) -> None:
        """Note each new request's tenancy scope and the step's aborted ids
        (``compat.request_scope``). Without them nothing is shared from then on."""
        info = request_scope.read(scheduler_output)
        if info is None:
            if self._scopes_reported:
                logger.warning("specdec: the engine process reports no cache_salt or aborts "
                               "(is the plugin registered there?); requests share no "
                               "n-gram corpus or statistics")
            self._scopes_reported = False
            return
        salts, aborted = info
        self._aborted |= aborted
        if self._scopes_reported:
            mode = self.config.ngram_corpus_scope
            for rid, salt in salts.items():
                self._scopes[rid] = scope_key(mode, salt)

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
        self._record_target_step(sampled_token_ids, req_ids)
        drafted0, accepted0 = self.stats.drafted, self.stats.accepted
        rows = [r for r, sampled in enumerate(sampled_token_ids) if sampled]
        for row in rows:  # roll back first: the controllers learn from this verification
            self._verified(req_ids[row], len(sampled_token_ids[row]) - 1, token_ids_cpu[row])
            self._shadow_outcome(req_ids[row], token_ids_cpu[row], int(num_tokens_no_spec[row]))
        self.metrics.verified(self.stats.drafted - drafted0, self.stats.accepted - accepted0)
        batch = len(rows)
        choices = {}
        for src, c in self.controllers.items():
            if self.config.adaptive:
                choices[src] = c.choose([req_ids[r] for r in rows], batch)
            else:
                c.begin_step()
        estimates = {src: (self._ngram_alpha if src == "ngram" else c.alpha,
                           c.cost_per_draft(batch), c.fixed_cost(batch))
                     for src, c in self.controllers.items()}
        backed_off0 = self.stats.no_draft["adaptive"] + self.stats.no_draft["load"]
        held = self._held(rows, req_ids, batch, choices, estimates) \
            if self.config.adaptive else None
        if held is not None:  # no plan could pay: skip the n-gram rounds and plans
            plans = []
            for row in rows:
                self.planner.hold(self.requests[req_ids[row]], int(num_tokens_no_spec[row]),
                                  held[req_ids[row]], self._end(row, req_ids[row]))
        else:
            plans = [p for p in (self.planner.plan(row, req_ids[row], self.requests[req_ids[row]],
                                                   int(num_tokens_no_spec[row]), token_ids_cpu[row],
                                                   choices, estimates, self._end(row, req_ids[row]))
                                 for row in rows) if p]
            if self.config.adaptive:
                plans = self._batch_check(plans, batch, estimates)
        model_plans: list[Plan] = []
        ngram_plans: list[Plan] = []
        for plan in plans:
            if self._constrain(plan, token_ids_cpu):
                (ngram_plans if plan.drafts else model_plans).append(plan)
        for plan in ngram_plans:  # n-gram drafts: ready, point masses
            out[plan.row] = plan.drafts
            self._committed_round(plan, "ngram")
        model_plans = self.planner.fit(model_plans) if model_plans else []
        drafting = [p for p in model_plans if p.k > 0]
        sampler = None
        if model_plans:
            sampler = self._draft(model_plans, token_ids_cpu)
            for p in drafting:
                out[p.row] = p.drafts
                self._committed_round(p, "draft")
        if drafting or ngram_plans:
            self._publish_draft_probs(drafting, ngram_plans, sampler)
        if self.match_alpha is not None:
            self._new_shadows([r for r in rows if not (out[r] and self.requests[req_ids[r]]
                                                        .source == "ngram")],
                              req_ids, token_ids_cpu, num_tokens_no_spec)
        verifies = any(out)
        if verifies:
            self.stats.rounds += 1
        if self.config.adaptive:  # after every cut (batch check, grammar, pool): the truth
            for c in self.controllers.values():
                c.step_verifies(verifies)
        self.metrics.chosen_k(len(d) for d in out if d)
        for reason, n in self._step_no_draft.items():
            self.metrics.no_draft(reason, n)
            self.metrics.chosen_k((0,) * n)
        self._step_no_draft.clear()
        self.metrics.sources(Counter(self.requests[req_ids[r]].source if out[r] else "none"
                                     for r in rows))
        self.metrics.backed_off(self.stats.no_draft["adaptive"] + self.stats.no_draft["load"]
                                - backed_off0)
        if self.allocator is not None:
            self.metrics.kv_blocks(self.allocator.num_used, self.allocator.num_blocks)
        return out

    def _held(self, rows: list[int], req_ids: list[str], batch: int, choices: dict,
              estimates: dict) -> dict[str, str] | None:
        """req_id -> reason for every row when no plans could pass the batch check
        (``adaptive.step_may_pay``: each row at the best k its controllers allow, the
        least σ), else None. Probe steps always plan.

        An n-gram row is bounded as the planner offers it: at the ceiling k and the
        best price any of its matches could get (also a row its controller holds for
        "adaptive": a long match may pay where the request's α does not)."""
        if any(c.probing for c in self.controllers.values()):
            return None
        bound = {req_ids[r]: 0.0 for r in rows}
        reason = dict.fromkeys(bound, "")
        fixed = None
        for src, (alpha, cost, sigma) in estimates.items():
            for rid, (k, why) in choices[src].items():
                if src == "ngram" and (k or why == "adaptive"):
                    k, a = self.config.num_speculative_tokens, alpha(rid, ANY_MATCH)
                else:
                    a = alpha(rid)
                if k:
                    bound[rid] = max(bound[rid], best_net_gain(a, k, cost))
                    fixed = sigma if fixed is None else min(fixed, sigma)
                elif not reason[rid]:
                    reason[rid] = why
        if fixed is not None and step_may_pay(list(bound.values()), batch, fixed):
            return None
        # a row some controller would draft for is held by the batch: "adaptive"
        return {rid: "adaptive" if bound[rid] or not reason[rid] else reason[rid]
                for rid in bound}

    def _batch_check(self, plans: list[Plan], batch: int, estimates: dict) -> list[Plan]:
        """The plans, or none when the step's drafts cannot pay its fixed cost σ, which
        all ``batch`` rows pay (``adaptive.batch_pays``). Probe steps always run."""
        if plans and not any(c.probing for c in self.controllers.values()):
            rows, fixed = [], 0.0
            for p in plans:
                alpha, cost, sigma = estimates["ngram" if p.drafts else "draft"]
                rows.append((alpha(p.req_id) if p.alpha is None else p.alpha, p.k, cost))
                fixed = max(fixed, sigma)
            if not batch_pays(rows, batch, fixed):
                for _ in plans:
                    self._no_draft("adaptive")
                plans = []
        return plans

    def _constrain(self, plan: Plan, token_ids_cpu: np.ndarray) -> bool:
        """Give a structured request's model plan its grammar copy (the drafts are then
        masked exactly as the target is); False when that copy is not usable yet.

        n-gram drafts need none: they are a function of the committed tokens, so the
        scheduler's grammar cut does not depend on a random draft (still exact).
        """
        if plan.drafts:
            return True
        sp = runner_hooks.sampling_params(self.runner, plan.req_id)
        if not is_structured(sp):
            return True
        plan.grammar, reason = self.grammars.ready(
            plan.req_id, sp, token_ids_cpu[plan.row], plan.length,
            runner_hooks.prompt_len(self.runner, plan.row))
        if plan.grammar is None:
            self._no_draft(reason)
            return False
        return True

    def _draft(self, plans: list[Plan], token_ids_cpu: np.ndarray) -> DraftSampler:
        """Run one round over ``plans`` (sorted by k desc) and book its results."""
        t0 = time.perf_counter()
        for p in plans:
            if p.k > 0:
                self._sampling_inputs(p, token_ids_cpu[p.row])
        sampler = DraftSampler([p.spec for p in plans], [p.prompt for p in plans],
                               [p.output for p in plans], [self._seed_for(p.req_id) for p in plans],
                               max(p.k for p in plans), self.vocab_size, self.device,
                               masks=self.grammars.round_masks([p.grammar for p in plans]),
                               lengths=[p.length for p in plans])
        drafts, passes = run_round(self.kernels, plans, sampler, self.device)
        drafts = drafts.tolist()  # the round's one device -> host copy
        limits = sampler.masks.finish() if sampler.masks else [None] * len(plans)
        fed = sum(len(p.new_tokens) for p in plans)
        self.stats.max_round_prefill = max(self.stats.max_round_prefill, fed)
        for i, p in enumerate(plans):
            self.stats.prefill_tokens += len(p.new_tokens)
            p.req.tokens.extend(p.new_tokens)
            if p.k > 0:  # a grammar that ended stops its row's drafts early
                p.drafts = drafts[i][: p.k if limits[i] is None else min(p.k, limits[i])]
                p.req.tokens.extend(p.drafts[:-1])  # d_k's KV is never computed
            p.req.table.num_tokens = len(p.req.tokens)
        dt = time.perf_counter() - t0
        self.draft_seconds += dt
        self.draft_forwards += passes
        self.metrics.draft_step(dt)
        if "draft" in self.controllers and any(p.k > 0 for p in plans):
            # pass 1 ran every catch-up token; each later pass one per row still drafting
            tokens = fed + sum(max(p.k - 1, 0) for p in plans)
            self.controllers["draft"].observe_draft_step(dt, passes, tokens)
        return sampler

    def _sampling_inputs(self, plan: Plan, committed_row: np.ndarray) -> None:
        """Sampled requests draft from q: give the plan its spec and histories."""
        spec = SamplingSpec.from_sampling_params(runner_hooks.sampling_params(self.runner, plan.req_id))
        if spec.is_greedy or self.config.draft_sampling != "sample":
            return
        plan.spec = spec
        if not spec.has_penalties:
            return  # the pipeline reads histories only for penalties
        n_prompt = runner_hooks.prompt_len(self.runner, plan.row)
        plan.prompt = committed_row[:n_prompt].tolist()
        plan.output = committed_row[n_prompt:plan.length].tolist()

    def _publish_draft_probs(self, drafting: list[Plan], ngram_plans: list[Plan],
                             sampler: DraftSampler | None) -> None:
        """q for every drafted row (model rows first, then n-gram rows)."""
        plans = drafting + ngram_plans
        sampled = [i for i, p in enumerate(drafting) if p.spec is not None]
        probs = draft_probs.build(sampled, sampler.q if sampler else None,
                                  [p.drafts for p in plans], self.vocab_size, self.device)
        if probs is not None:
            runner_hooks.set_draft_probs(self.runner, [p.req_id for p in plans], probs)

    # ------------------------------------------------------------ bookkeeping

    def _record_target_step(self, sampled_token_ids: list[list[int]], req_ids: list[str]) -> None:
        """Time the target step that just ended, as ``verify`` or ``plain``.

        Steps that ran any prefill (a row still prefilling, or a request's first
        round) are not recorded: their cost says nothing about decoding.
        """
        exact_s = runner_hooks.take_exact_sampler_seconds(self.runner)  # this step's
        if self._step_t0 is None:
            return
        seconds = time.perf_counter() - self._step_t0
        self._step_t0 = None
        verify, num_tokens = False, 0
        for row, sampled in enumerate(sampled_token_ids):
            req = self.requests.get(req_ids[row]) if sampled else None
            if req is None or not req.seen:
                return  # prefill in this step
            verify = verify or bool(req.drafted)
            num_tokens += 1 + len(req.drafted)  # the target ran L+1 .. L+1+k for this row
        emitted = sum(len(s) for s in sampled_token_ids)
        self.metrics.target_step("verify" if verify else "plain", seconds, emitted)
        # The exact sampler runs only on verifying steps: priced apart as sigma, so the
        # T(n) fit sees the forward's cost per token, not a jump at the first draft.
        exact_s = min(exact_s, seconds)
        for c in self.controllers.values():
            c.observe_target_step(seconds - exact_s, num_tokens)
            if verify:
                c.observe_spec_overhead(exact_s)

    def _verified(self, req_id: str, num_accepted: int, committed_row: np.ndarray) -> None:
        """Book the verification of a request's last drafts and roll the draft KV back."""
        req = self.requests.get(req_id)
        if req is None:
            req = self.requests[req_id] = RequestState(scope=self._scopes.get(req_id))
            for c in self.controllers.values():
                c.join(req_id, req.scope)
        if req.drafted:
            accepted = max(0, min(num_accepted, len(req.drafted)))
            if req.source in self.controllers:
                self.controllers[req.source].observe_round(req_id, len(req.drafted), accepted)
            if req.match is not None and self.match_alpha is not None:  # an n-gram round
                self.match_alpha.get(req.scope).observe(req.match, len(req.drafted), accepted)
            roll_back(req, accepted, committed_row, self.allocator, self.stats)

    def _shadow_outcome(self, req_id: str, committed_row: np.ndarray, length: int) -> None:
        """Book a request's shadow proposal once the committed tokens decide it, as
        the n-gram round it would have been (``shadow``)."""
        req = self.requests[req_id]
        outcome = req.shadow.outcome(committed_row, length) if req.shadow else None
        if outcome is None:
            return
        drafted, accepted = outcome
        self.controllers["ngram"].observe_round(req_id, drafted, accepted)
        self.match_alpha.get(req.scope).observe(req.shadow.match, drafted, accepted)
        self.stats.shadow_drafted += drafted
        self.stats.shadow_accepted += accepted
        self.metrics.shadow(drafted, accepted)
        req.shadow = None

    def _new_shadows(self, rows: list[int], req_ids: list[str], token_ids_cpu: np.ndarray,
                     num_tokens_no_spec: np.ndarray) -> None:
        """Shadow n-gram proposals for a few of ``rows`` (those that verify no n-gram
        drafts next step) that have none pending (``shadow.take_turns``)."""
        idle = [r for r in rows if self.requests[req_ids[r]].shadow is None]
        self._shadow_turn += 1
        for row in take_turns(idle, self._shadow_turn):
            req, length = self.requests[req_ids[row]], int(num_tokens_no_spec[row])
            drafts, match = self.planner.shadow_drafts(req, token_ids_cpu[row], length,
                                                       SHADOW_K, self._end(row, req_ids[row]))
            if drafts:
                req.shadow = Shadow(length, drafts, match)

    def _committed_round(self, plan: Plan, source: str) -> None:
        if source == "ngram":
            plan.req.shadow = None  # a verified round measures the same thing
        self.stats.by_source[source] += 1
        plan.req.committed = plan.length
        plan.req.drafted = list(plan.drafts)
        plan.req.source = source
        plan.req.match = plan.match

    def _end(self, row: int, req_id: str) -> int | None:
        """Committed length at which the request finishes: prompt + max_tokens (None
        where vLLM gives no max_tokens)."""
        max_tokens = getattr(runner_hooks.sampling_params(self.runner, req_id), "max_tokens", None)
        return None if max_tokens is None else runner_hooks.prompt_len(self.runner, row) + max_tokens

    def _ngram_alpha(self, req_id: str, match: MatchKey | None = None) -> float:
        """α of a request's n-gram drafts; with ``match``, of a proposal from a match
        in that bucket (``match_pricing``); with ``ANY_MATCH``, the most any could get."""
        c = self.controllers["ngram"]  # exists exactly when match_alpha does
        if match is None:
            return c.alpha(req_id)
        scope = c.scope_of(req_id)
        return self.match_alpha.get(scope).alpha(match, c.alpha(req_id), c.global_alpha(scope))

    def _no_draft(self, reason: str) -> None:
        """Count a request-round decoded without drafts (k = 0 this round); the metrics
        get the step's counts once, at the end of propose()."""
        self.stats.no_draft[reason] += 1
        self._step_no_draft[reason] += 1

    def _seed_for(self, req_id: str) -> int | None:
        """The request's seed: its sampled drafts race q against the same per-position
        noise as its verification (``rejection.position_noise``)."""
        seed = getattr(runner_hooks.sampling_params(self.runner, req_id), "seed", None)
        return None if seed is None else int(seed)
