"""One step's draft-model round from the planner's plans, booked and handed on.

The proposer decides who drafts; this runs the batched round (``draft/round.py``) with
each row's sampling inputs, seed and grammar mask, books its wall time into the cost
model (``step_cost``) and the metrics, and publishes q for the rejection sampler.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from vllm_specdec_plugin import draft_probs
from vllm_specdec_plugin.compat import runner_hooks
from vllm_specdec_plugin.compat.draft_grammar import DraftGrammars
from vllm_specdec_plugin.compat.draft_model import DraftKernels
from vllm_specdec_plugin.draft.round import draft_plans
from vllm_specdec_plugin.draft.sampler import DraftSampler
from vllm_specdec_plugin.planning import Plan
from vllm_specdec_plugin.row_inputs import sampling_inputs, seed_for
from vllm_specdec_plugin.step_cost import StepCost


class DraftBatch:
    """Runs and books draft rounds on the proposer's kernels and device."""

    def __init__(self, draft_sampling: str, grammars: DraftGrammars, vocab_size: int,
                 stats: Any, metrics: Any, step_cost: StepCost):
        self.draft_sampling = draft_sampling
        self.grammars = grammars
        self.vocab_size = vocab_size
        self.stats, self.metrics, self.step_cost = stats, metrics, step_cost
        self.seconds = 0.0   # wall time spent in draft rounds (for c')
        self.forwards = 0    # draft forward passes run

    def run(self, runner: Any, kernels: DraftKernels, device: torch.device, plans: list[Plan],
            token_ids_cpu: np.ndarray) -> DraftSampler:
        """One round over ``plans`` (sorted by k desc; token_ids_cpu: [rows, max_model_len]
        committed tokens); fills each plan's drafts and returns the sampler (q)."""
        t0 = time.perf_counter()
        for p in plans:
            if p.k > 0:
                sampling_inputs(runner, p, token_ids_cpu[p.row], self.draft_sampling)
        sampler = DraftSampler([p.spec for p in plans], [p.prompt for p in plans],
                               [p.output for p in plans],
                               [seed_for(runner, p.req_id) for p in plans],
                               max(p.k for p in plans), self.vocab_size, device,
                               masks=self.grammars.round_masks([p.grammar for p in plans]),
                               lengths=[p.length for p in plans])
        fed = sum(len(p.new_tokens) for p in plans)  # before the round feeds them
        passes = draft_plans(kernels, plans, sampler, device, self.stats)
        dt = time.perf_counter() - t0
        self.seconds += dt
        self.forwards += passes
        self.metrics.draft_step(dt)
        if any(p.k > 0 for p in plans):
            # pass 1 ran every catch-up token; each later pass one per row still drafting
            tokens = fed + sum(max(p.k - 1, 0) for p in plans)
            self.step_cost.observe_draft_step(dt, passes, tokens)
        return sampler

    def publish(self, runner: Any, device: torch.device, drafting: list[Plan],
                ngram_plans: list[Plan], sampler: DraftSampler | None) -> None:
        """q [rows, K, V] for every drafted row (model rows first, then n-gram rows)."""
        plans = drafting + ngram_plans
        sampled = [i for i, p in enumerate(drafting) if p.spec is not None]
        probs = draft_probs.build(sampled, sampler.q if sampler else None,
                                  [p.drafts for p in plans], self.vocab_size, device)
        if probs is not None:
            runner_hooks.set_draft_probs(runner, [p.req_id for p in plans], probs)
