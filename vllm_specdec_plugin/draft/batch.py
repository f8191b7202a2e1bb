"""One step's draft-model round: runs the batched passes (``draft/round.py``) with each
row's sampling inputs, seed and grammar mask, books its time (``control.cost``,
metrics) and publishes q for the rejection sampler.
"""

from __future__ import annotations

import logging
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
from vllm_specdec_plugin.row_inputs import sampling_inputs
from vllm_specdec_plugin.control.cost import StepCost
from vllm_specdec_plugin.step_record import step_log


class DecodePassTimer:
    """Seconds of a round's decode passes (from pass 1's end to now); on CUDA an event
    pair, so the k loop has no host-device sync (read after the round's host copy)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.mark: Any = None

    def first_pass_done(self) -> None:
        if self.cuda:
            self.mark = torch.cuda.Event(enable_timing=True)
            self.mark.record()
        else:
            self.mark = time.perf_counter()

    def decode_seconds(self) -> float:
        if self.mark is None:
            return 0.0
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return self.mark.elapsed_time(end) / 1e3
        return time.perf_counter() - self.mark


class DraftBatch:
    """Runs and books draft rounds on the proposer's kernels and device."""

    def __init__(self, grammars: DraftGrammars, vocab_size: int, stats: Any, metrics: Any,
                 step_cost: StepCost, seed_streams: Any):
        self.grammars = grammars
        self.seed_streams = seed_streams  # token_draw.SeedStreams, shared with verification
        self.vocab_size = vocab_size
        self.stats, self.metrics, self.step_cost = stats, metrics, step_cost
        self.seconds = 0.0   # wall time spent in draft rounds (for c')
        self.forwards = 0    # draft forward passes run

    def run(self, runner: Any, kernels: DraftKernels, device: torch.device, plans: list[Plan],
            token_ids_cpu: np.ndarray) -> DraftSampler:
        """One round over ``plans`` (by k desc; token_ids_cpu: [rows, max_model_len]); fills
        each plan's drafts and returns the sampler (q)."""
        t0 = time.perf_counter()
        for p in plans:
            if p.k > 0:
                sampling_inputs(runner, p, token_ids_cpu[p.row])
        sampler = DraftSampler([p.spec for p in plans], [p.prompt for p in plans],
                               [p.output for p in plans],
                               [self._stream(runner, p) for p in plans],
                               max(p.k for p in plans), self.vocab_size, device,
                               masks=self.grammars.round_masks([p.grammar for p in plans]))
        fed = sum(len(p.new_tokens) for p in plans)  # before the round feeds them
        timer = DecodePassTimer(device)
        passes = draft_plans(kernels, plans, sampler, device, self.stats, timer.first_pass_done)
        dt = time.perf_counter() - t0
        self.seconds += dt
        self.forwards += passes
        self.metrics.draft_step(dt)
        # DEBUG per round (benchmarks/step_log.json): tells a long sample_tokens that is
        # this round from a host pause, in the timeline of a served cell
        if step_log.isEnabledFor(logging.DEBUG):
            step_log.debug("specdec round: s %.2f fed %d rows %d drafts %d passes %d",
                           1e3 * dt, fed, len(plans), sum(p.k for p in plans), passes)
        later = sum(max(p.k - 1, 0) for p in plans)  # one token per row per later pass
        decode_s = timer.decode_seconds() if passes > 1 else 0.0
        # pass 1 (the round's set-up and every row's catch-up): prices a lagging draft KV
        if fed:
            self.step_cost.observe_catch_up(max(dt - decode_s, 0.0), fed)
        if any(p.k > 0 for p in plans):
            if fed == len(plans):  # pass 1 fed one token a row: a forward like the others
                self.step_cost.observe_draft(dt, passes, fed + later)
            elif passes > 1:
                # Pass 1 caught up a lazy prefill, a one-off: priced as a forward, a first
                # round of a few hundred prompt tokens read as c' ~ 1 and kept the draft
                # priced out for good (smol float32 serving: 1-3 draft rounds per cell at
                # c = 1-8). Only the decode passes are booked; pass 1 alone books nothing.
                self.step_cost.observe_draft(decode_s, passes - 1, later)
        return sampler

    def _stream(self, runner: Any, p: Plan) -> tuple[Any, int] | None:
        """A seeded sampled plan's (seed stream, output index its first draft takes)."""
        if p.spec is None or p.spec.seed is None:
            return None
        prompt = runner_hooks.prompt_len(runner, p.row)
        return self.seed_streams.get(p.req_id, p.spec.seed, prompt), p.length - prompt

    def publish(self, runner: Any, device: torch.device, drafting: list[Plan],
                ngram_plans: list[Plan], sampler: DraftSampler | None) -> None:
        """q [rows, K, V] for every drafted row (model rows first, then n-gram rows)."""
        plans = drafting + ngram_plans
        sampled = [i for i, p in enumerate(drafting) if p.spec is not None]
        probs = draft_probs.build(sampled, sampler.q if sampler else None,
                                  [p.drafts for p in plans], self.vocab_size, device)
        if probs is not None:
            runner_hooks.set_draft_probs(runner, [p.req_id for p in plans], probs)
