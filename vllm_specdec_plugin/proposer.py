"""DraftModelProposer: the draft side of speculative decoding, as a vLLM proposer.

Selected with ``--speculative-config '{"method": "custom_class", "model":
"vllm_specdec_plugin.DraftModelProposer", "num_speculative_tokens": K, ...}'``.

Each engine step vLLM calls ``propose`` after the target verified the previous
drafts. For every running request the proposer

1. rolls its draft KV back to the accepted length (block-table trim);
2. lazily feeds the draft every committed token it has not seen (the whole prompt on
   the first round: lazy prefill; after that the last accepted/bonus tokens);
3. drafts k tokens with k batched draft forwards (one per draft position, all
   requests together), greedy or sampled from the request's own distribution q.

The draft runs on its own paged KV cache (``kv/``) with its own allocator; the
target verifies all drafts in vLLM's normal batched forward (no extra target pass).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from vllm_specdec_plugin.compat import rejection_adapter, runner_hooks
from vllm_specdec_plugin.config import SpecDecConfig, from_vllm_config
from vllm_specdec_plugin.draft.checks import (check_draft_budget, check_draft_compatible,
                                              resolve_draft_path)
from vllm_specdec_plugin.kv import BlockAllocator, BlockTable, PagedKVCache
from vllm_specdec_plugin.kv.paged_cache import BatchLayout
from vllm_specdec_plugin.sampling.pipeline import SamplingSpec
from vllm_specdec_plugin.adaptive import AdaptiveConfig, AdaptiveK
from vllm_specdec_plugin.metrics import ProposerMetrics
from vllm_specdec_plugin.ngram import NGramConfig, NGramIndex
from vllm_specdec_plugin.stats import ProposerStats, RequestAcceptance

# A child of "vllm" so records reach the handler vLLM configures (same format, same level).
logger = logging.getLogger("vllm.specdec_plugin")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class _Request:
    """Draft-side state of one request."""

    table: BlockTable = field(default_factory=BlockTable)
    tokens: list[int] = field(default_factory=list)  # tokens whose KV is cached
    committed: int = 0      # committed length when we last drafted
    drafted: list[int] = field(default_factory=list)  # drafts proposed last round
    source: str = "draft"   # who proposed them: "draft" (model) or "ngram"
    seen: bool = False      # had a propose() round since its (re)prefill
    generator: torch.Generator | None = None
    acceptance: RequestAcceptance = field(default_factory=RequestAcceptance)
    ngram: Any = None       # NGramIndex over the committed tokens (ngram/hybrid)


@dataclass(slots=True)
class _Plan:
    """One request's work in this round."""

    row: int                # row in the runner's batch
    req_id: str
    req: _Request
    new_tokens: list[int]   # committed tokens to feed before drafting
    length: int             # committed length L
    k: int                  # drafts wanted this round
    spec: Any = None        # SamplingSpec, or None for greedy
    prompt: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    drafts: list[int] = field(default_factory=list)
    q: list[torch.Tensor] = field(default_factory=list)  # [V] per draft (sampled rows)


class DraftModelProposer:
    """A vLLM ``custom_class`` proposer running a draft LM on its own paged KV cache."""

    _specdec_lifecycle = True  # marker read by compat.runner_hooks

    def __init__(self, vllm_config: Any):
        self.vllm_config = vllm_config
        self.config: SpecDecConfig = from_vllm_config(vllm_config)
        self.k = self.config.num_speculative_tokens
        mc = vllm_config.model_config
        self.max_model_len = int(mc.max_model_len)
        self.uses_model = self.config.method in ("draft", "hybrid")
        self.uses_ngram = self.config.method in ("ngram", "hybrid")
        self.draft_path = None
        self.vocab_size = int(getattr(mc.hf_config, "vocab_size", 0) or 0)
        if self.uses_model:
            self.draft_path = resolve_draft_path(self.config.draft_model)
            self.draft_hf_config = check_draft_compatible(
                self.draft_path, mc.hf_config, mc.tokenizer, mc.model, self.max_model_len,
                self.config.tokenizer_probe)
            self.vocab_size = int(self.draft_hf_config["vocab_size"])
        # Adaptive k: one controller per draft source; the n-gram source costs no
        # draft time, so only the verify cost limits its k.
        self.controllers: dict[str, AdaptiveK] = {}
        if self.config.adaptive:
            for source in (["draft"] if self.uses_model else []) + (["ngram"] if self.uses_ngram else []):
                self.controllers[source] = AdaptiveK(AdaptiveConfig(
                    k_max=self.k, prior_alpha=self.config.adaptive_prior_alpha,
                    c_prime_default=0.05 if source == "draft" else 0.0))
        if self.config.draft_dtype == "auto":
            self.dtype = mc.dtype if isinstance(mc.dtype, torch.dtype) else torch.float32
        else:
            self.dtype = _DTYPES[self.config.draft_dtype]
        self.model = None
        self.ready = False  # load_model() ran
        self.cache: PagedKVCache | None = None
        self.allocator: BlockAllocator | None = None
        self.runner: Any = None
        self.requests: dict[str, _Request] = {}
        self.stats = ProposerStats()
        self.draft_seconds = 0.0   # wall time spent in draft forwards (for c')
        self.draft_forwards = 0
        self.metrics = ProposerMetrics(str(getattr(mc, "served_model_name", None) or mc.model))
        self._step_t0: float | None = None  # when the current engine step began
        # Only now, when the user selected this proposer: GPUModelRunner.__init__ builds
        # its rejection sampler and input batch right after constructing us.
        runner_hooks.install()
        rejection_adapter.install_worker_patches()

    # ------------------------------------------------------------------ set-up

    def load_model(self, target_model: Any = None) -> None:
        """Load draft weights and size the draft KV pool from the memory budget."""
        from vllm_specdec_plugin.draft.llama import DraftLlama

        device = torch.device("cpu")
        if target_model is not None:
            p = next(iter(target_model.parameters()), None)
            if p is not None:
                device = p.device
        self.device = device
        self.ready = True
        if not self.uses_model:
            logger.info("specdec: n-gram drafting (max_n %d, min_n %d, window %d); no draft model",
                        self.config.ngram_max_n, self.config.ngram_min_n, self.config.ngram_window)
            return
        self.model = DraftLlama(self.draft_path, self.dtype, device)
        m, bs = self.model, self.config.block_size
        num_blocks = check_draft_budget(self.draft_hf_config, str(self.dtype).removeprefix("torch."),
                                        bs, self.config.draft_kv_cache_mib, self.max_model_len)
        self.allocator = BlockAllocator(num_blocks, bs)
        self.metrics.kv_blocks(0, num_blocks)
        self.cache = PagedKVCache(m.num_layers, num_blocks, bs, m.num_kv_heads, m.head_dim,
                                  self.dtype, device)
        logger.info(
            "specdec: draft %s (%d layers, hidden %d, %s) on %s; draft KV cache %d blocks x %d "
            "tokens = %d tokens, %.1f MiB", self.draft_path, m.num_layers, m.hidden,
            str(self.dtype).removeprefix("torch."), device, num_blocks, bs, num_blocks * bs,
            self.cache.nbytes / 2**20)

    def bind_runner(self, runner: Any) -> None:
        self.runner = runner
        runner_hooks.bind_sampler(runner)

    # --------------------------------------------------------------- lifecycle

    def on_scheduler_output(self, scheduler_output: Any) -> None:
        """Free draft blocks of finished, aborted and preempted requests."""
        # The step's target work runs between now and the propose() call that ends it.
        self._step_t0 = time.perf_counter()
        for rid in runner_hooks.finished_req_ids(scheduler_output):
            req = self.requests.pop(rid, None)
            if req is not None:
                self._release(req)
                self.metrics.request_finished(req.acceptance.drafted, req.acceptance.accepted)
                for c in self.controllers.values():
                    c.forget(rid)
        for rid in runner_hooks.preempted_req_ids(scheduler_output):
            req = self.requests.get(rid)
            if req is not None:  # resumed later: re-prefilled lazily
                self._release(req)
                req.tokens.clear()
                req.drafted = []
                req.seen = False
        if self.allocator is not None:  # idle servers step once more to free: keep the gauge true
            self.metrics.kv_blocks(self.allocator.num_used, self.allocator.num_blocks)

    def _release(self, req: _Request) -> None:
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
        self.metrics.verified(self.stats.drafted - drafted0, self.stats.accepted - accepted0)
        choices = {src: c.choose([req_ids[r] for r in rows], len(rows))
                   for src, c in self.controllers.items()}
        model_plans: list[_Plan] = []
        ngram_plans: list[_Plan] = []
        for row in rows:
            plan = self._plan_request(row, req_ids[row], int(num_tokens_no_spec[row]),
                                      token_ids_cpu[row], choices)
            if plan is None:
                continue
            if plan.drafts:  # n-gram drafts: ready, point masses
                out[row] = plan.drafts
                self._committed_round(plan, "ngram")
                ngram_plans.append(plan)
            else:
                model_plans.append(plan)
        if model_plans:
            t0 = time.perf_counter()
            self._draft(model_plans)
            dt = time.perf_counter() - t0
            self.draft_seconds += dt
            self.metrics.draft_step(dt)
            if "draft" in self.controllers:
                self.controllers["draft"].observe_draft_step(
                    dt, max(p.k for p in model_plans), len(model_plans))
            for p in model_plans:
                out[p.row] = p.drafts
                self._committed_round(p, "draft")
            # Every drafted row needs q (one-hot for n-gram rows): vLLM drops the
            # whole batch's q if one drafted request is missing from the channel.
            self._publish_draft_probs(model_plans + ngram_plans)
        if any(out):
            self.stats.rounds += 1
        self.metrics.chosen_k(len(d) for d in out if d)
        if self.allocator is not None:
            self.metrics.kv_blocks(self.allocator.num_used, self.allocator.num_blocks)
        return out

    def _record_target_step(self, sampled_token_ids: list[list[int]], req_ids: list[str]) -> None:
        """Time the target step that just ended, as ``verify`` or ``plain``.

        Steps that ran any prefill (a row still prefilling, or a request's first
        round) are not recorded: their cost says nothing about decoding.
        """
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
        for c in self.controllers.values():
            c.observe_target_step(seconds, num_tokens)

    def _verified(self, req_id: str, num_accepted: int, committed_row: np.ndarray) -> None:
        """Book the verification of a request's last drafts and roll the draft KV back."""
        req = self.requests.get(req_id)
        if req is None:
            req = self.requests[req_id] = _Request()
            req.generator = self._generator_for(req_id)
        if req.drafted:
            accepted = max(0, min(num_accepted, len(req.drafted)))
            if req.source in self.controllers:
                self.controllers[req.source].observe_round(req_id, len(req.drafted), accepted)
            self._rollback(req, accepted, committed_row)

    def _plan_request(self, row: int, req_id: str, length: int, committed_row: np.ndarray,
                      choices: dict[str, dict[str, tuple[int, str]]]) -> _Plan | None:
        """Decide this round's drafts for a request: n-gram drafts now, or a model plan.

        Returns None for no drafts (the reason is counted), a plan with ``drafts``
        filled for n-gram drafts, or a plan without drafts for the draft model.
        """
        req = self.requests[req_id]
        req.seen = True
        k_room = min(self.k, self.max_model_len - length - 1)
        if k_room <= 0:  # no room: verifying L + k tokens must emit at most max_model_len
            return self._no_draft("length_guard")
        reason = ""
        if self.uses_ngram:
            k, reason = self._chosen_k(choices, "ngram", req_id, k_room)
            if k:
                drafts = self._ngram_drafts(req, committed_row, length, k)
                need = 1 if self.config.method == "ngram" else min(self.config.hybrid_min_ngram, k)
                if len(drafts) >= need:
                    return _Plan(row=row, req_id=req_id, req=req, new_tokens=[],
                                 length=length, k=len(drafts), drafts=drafts)
                reason = "ngram_miss"
        if not self.uses_model:
            return self._no_draft(reason or "ngram_miss")
        k, reason = self._chosen_k(choices, "draft", req_id, k_room)
        if not k:
            return self._no_draft(reason)
        if not self.allocator.can_reserve(req.table, length + k - 1):
            return self._no_draft("pool_full")
        self.allocator.reserve(req.table, length + k - 1)
        new = committed_row[len(req.tokens):length].tolist()
        plan = _Plan(row=row, req_id=req_id, req=req, new_tokens=new, length=length, k=k)
        sp = runner_hooks.sampling_params(self.runner, req_id)
        spec = SamplingSpec.from_sampling_params(sp)
        if not spec.is_greedy and self.config.draft_sampling == "sample":
            n_prompt = runner_hooks.prompt_len(self.runner, row)
            plan.spec = spec
            plan.prompt = committed_row[:n_prompt].tolist()
            plan.output = committed_row[n_prompt:length].tolist()
        return plan

    def _chosen_k(self, choices: dict, source: str, req_id: str, k_room: int) -> tuple[int, str]:
        """(k, reason-if-0) for a source: the controller's choice, or the fixed k."""
        if source in choices:
            k, reason = choices[source].get(req_id, (self.k, ""))
            return min(k, k_room), reason
        return k_room, ""

    def _ngram_drafts(self, req: _Request, committed_row: np.ndarray, length: int, k: int) -> list[int]:
        """Prompt-lookup drafts over the committed tokens (the index catches up lazily)."""
        if req.ngram is None:
            c = self.config
            req.ngram = NGramIndex(NGramConfig(c.ngram_max_n, c.ngram_min_n, c.ngram_window))
        if len(req.ngram) < length:
            req.ngram.extend(committed_row[len(req.ngram):length])
        return req.ngram.propose(k)

    def _committed_round(self, plan: _Plan, source: str) -> None:
        self.stats.by_source[source] += 1
        plan.req.committed = plan.length
        plan.req.drafted = list(plan.drafts)
        plan.req.source = source

    def _no_draft(self, reason: str) -> None:
        """Count a request-round decoded without drafts (k = 0 this round)."""
        self.stats.no_draft[reason] += 1
        self.metrics.no_draft(reason)
        self.metrics.chosen_k((0,))
        return None

    def _rollback(self, req: _Request, accepted: int, committed_row: np.ndarray) -> None:
        """Trim the draft KV to what the target accepted from our last drafts.

        The last round cached the committed tokens plus drafts d1..d_{k-1} (d_k's KV
        was never computed). ``accepted`` (already clamped to the drafts) of them were
        accepted; their KV is valid.
        """
        drafted = req.drafted
        req.acceptance.rounds += 1
        req.acceptance.drafted += len(drafted)
        req.acceptance.accepted += accepted
        self.stats.record_verification(len(drafted), accepted)
        valid = min(req.committed + accepted, len(req.tokens))
        # Defensive cross-check against the committed tokens (cheap: <= k entries).
        lo = req.committed
        seen = committed_row[lo:valid].tolist()
        if seen != req.tokens[lo:valid]:
            self.stats.resyncs += 1
            match = lo
            while match < valid and committed_row[match] == req.tokens[match]:
                match += 1
            valid = match
        del req.tokens[valid:]
        req.table.num_tokens = valid
        if self.allocator is not None:
            self.allocator.trim(req.table, valid)
        req.drafted = []

    def _generator_for(self, req_id: str) -> torch.Generator | None:
        sp = runner_hooks.sampling_params(self.runner, req_id)
        seed = getattr(sp, "seed", None)
        if seed is None:
            return None
        g = torch.Generator(device="cpu")
        g.manual_seed((int(seed) * 0x9E3779B1 + 1) & 0xFFFFFFFFFFFF)  # distinct from target's stream
        return g

    # ------------------------------------------------------------ draft passes

    def _draft(self, plans: list[_Plan]) -> None:
        """k batched draft forwards. Pass 1 feeds all unseen committed tokens."""
        bs = self.config.block_size
        nb = max(len(p.req.table.blocks) for p in plans)
        tables = torch.zeros((len(plans), nb), dtype=torch.int64)
        for i, p in enumerate(plans):
            tables[i, : len(p.req.table.blocks)] = torch.tensor(p.req.table.blocks)
        tables = tables.to(self.device)

        active = list(range(len(plans)))
        tokens = [t for p in plans for t in p.new_tokens]
        qlens = [len(p.new_tokens) for p in plans]
        seqlens = [p.length for p in plans]
        self.stats.prefill_tokens += len(tokens)
        step = 0
        while active:
            layout = BatchLayout.build(torch.tensor(qlens), torch.tensor(seqlens),
                                       tables[active] if step else tables, bs)
            logits = self.model.forward(torch.tensor(tokens, device=self.device), layout, self.cache)
            self.draft_forwards += 1
            drafts = self._sample([plans[i] for i in active], logits)
            for i, tok in zip(active, drafts):
                plans[i].drafts.append(tok)
            if step == 0:
                for p in plans:  # committed tokens are now cached
                    p.req.tokens.extend(p.new_tokens)
            step += 1
            nxt = [i for i in active if plans[i].k > step]
            for i in nxt:  # the draft token we feed next becomes cached too
                plans[i].req.tokens.append(plans[i].drafts[-1])
            tokens = [plans[i].drafts[-1] for i in nxt]
            qlens = [1] * len(nxt)
            seqlens = [plans[i].length + step for i in nxt]
            active = nxt
        for p in plans:
            p.req.table.num_tokens = len(p.req.tokens)

    def _sample(self, plans: Sequence[_Plan], logits: torch.Tensor) -> list[int]:
        """One draft token per plan from logits [B, V]: argmax, or a sample from q."""
        out = logits.argmax(-1).tolist()
        sampled = [i for i, p in enumerate(plans) if p.spec is not None]
        if not sampled:
            return out
        from vllm_specdec_plugin.rejection import sample_from_weights
        from vllm_specdec_plugin.sampling.pipeline import target_probs

        specs = [plans[i].spec for i in sampled]
        q = target_probs(logits[sampled], specs, [plans[i].prompt for i in sampled],
                         [plans[i].output + plans[i].drafts for i in sampled])  # [S, V]
        # One uniform per row: seeded requests draw from their own generator (same
        # seed, same drafts); the others share one batched draw.
        u = torch.rand(len(sampled), dtype=torch.float64)
        for j, i in enumerate(sampled):
            g = plans[i].req.generator
            if g is not None:
                u[j] = torch.rand(1, dtype=torch.float64, generator=g)
        tokens = sample_from_weights(q, u.to(q.device)).tolist()
        for j, i in enumerate(sampled):
            out[i] = tokens[j]
            plans[i].q.append(q[j])
        return out

    def _publish_draft_probs(self, plans: list[_Plan]) -> None:
        """Give the rejection sampler q for every drafted request (one-hot for greedy)."""
        if not any(p.spec is not None for p in plans):
            return
        V, K = self.vocab_size, max(p.k for p in plans)
        dev = self.runner.device if hasattr(self.runner, "device") else self.device
        probs = torch.zeros((len(plans), K, V), dtype=torch.float32)
        for i, p in enumerate(plans):
            if p.q:
                probs[i, : len(p.q)] = torch.stack(p.q).float()
            else:  # greedy request in a mixed batch: the draft is a point mass
                probs[i, torch.arange(len(p.drafts)), torch.tensor(p.drafts)] = 1.0
        runner_hooks.set_draft_probs(self.runner, [p.req_id for p in plans], probs.to(dev))
