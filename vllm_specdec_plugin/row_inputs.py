"""What a row's request asks of its drafts, read from the runner: where it ends, its
grammar, and the sampling inputs of a sampled request drafting from q."""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_specdec_plugin.compat import runner_hooks
from vllm_specdec_plugin.compat.draft_grammar import is_structured
from vllm_specdec_plugin.sampling.pipeline import SAMPLING_EPS, SamplingSpec


def end_of(runner: Any, row: int, req_id: str) -> int | None:
    """Committed length at which the request finishes: prompt + max_tokens (None
    where vLLM gives no max_tokens)."""
    max_tokens = getattr(runner_hooks.sampling_params(runner, req_id), "max_tokens", None)
    return None if max_tokens is None else runner_hooks.prompt_len(runner, row) + max_tokens


def is_sampled(runner: Any, req_id: str) -> bool:
    """The request samples (temperature above vLLM's greedy threshold)."""
    sp = runner_hooks.sampling_params(runner, req_id)
    return sp is not None and float(sp.temperature) >= SAMPLING_EPS


def sampling_inputs(runner: Any, plan: Any, committed_row: np.ndarray) -> None:
    """Give a sampled request's ``planning.Plan`` its SamplingSpec (it drafts from q)
    and, for penalties, its prompt and output histories (committed_row:
    [max_model_len] tokens)."""
    spec = SamplingSpec.from_sampling_params(runner_hooks.sampling_params(runner, plan.req_id))
    if spec.is_greedy:
        return
    plan.spec = spec
    if not spec.has_penalties:
        return  # the pipeline reads histories only for penalties
    n_prompt = runner_hooks.prompt_len(runner, plan.row)
    plan.prompt = committed_row[:n_prompt].tolist()
    plan.output = committed_row[n_prompt:plan.length].tolist()


def grammar_for(runner: Any, grammars: Any, plan: Any, committed_row: np.ndarray) -> str:
    """Give a structured request's model plan its grammar copy (``DraftGrammars``;
    the drafts are then masked exactly as the target is). Returns "" when the plan
    may draft, else the no-draft reason (that copy is not usable yet).

    n-gram drafts need none: they are a function of the committed tokens, so the
    scheduler's grammar cut does not depend on a random draft (still exact)."""
    if plan.drafts:
        return ""
    sp = runner_hooks.sampling_params(runner, plan.req_id)
    if not is_structured(sp):
        return ""
    plan.grammar, reason = grammars.ready(plan.req_id, sp, committed_row, plan.length,
                                          runner_hooks.prompt_len(runner, plan.row))
    return "" if plan.grammar is not None else reason
