"""The step's draft token ids travel with its sampled tokens, not in a second RPC.

Worker half: ``sample_tokens`` / ``take_draft_token_ids``; EngineCore half:
``update_from_output`` / ``post_step``. Why and how: those rows of ``compat.patches``.
"""

from __future__ import annotations

from typing import Any

from vllm_specdec_plugin.compat import runner_hooks
from vllm_specdec_plugin.compat.scheduler import HINT_ATTR

ATTR = "specdec_draft_ids"      # on ModelRunnerOutput: (DraftTokenIds | None,)
_DEFERRED = "_specdec_deferred_propose"  # on the runner: (propose, args, kwargs)
_APPLIED = "_specdec_drafts_applied"   # on the Scheduler: this step's drafts are in
# Steps of this process's engine whose drafts came with the output / needed the RPC,
# and this process's worker steps whose drafting waited for the RPC (tests read them
# in-process; "rpc" stays 0 until a first token defers a step's drafting).
counts = {"carried": 0, "rpc": 0, "deferred": 0}


def wrap_sample_tokens(original: Any) -> Any:
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    drafter_is_ours = runner_hooks.drafter_is_ours

    def sample_tokens(self, *args, **kwargs):  # noqa: ANN001 - vLLM signature
        if self.use_async_scheduling or not drafter_is_ours(self):
            return original(self, *args, **kwargs)
        if getattr(self, runner_hooks.FIRST_TOKENS, None):
            # A first token leaves with this output; the drafting runs at the RPC.
            return _sampled_drafting_later(self, original, args, kwargs)
        out = original(self, *args, **kwargs)
        if type(out) is ModelRunnerOutput and out is not EMPTY_MODEL_RUNNER_OUTPUT:
            setattr(out, ATTR, (self.take_draft_token_ids(),))
        return out

    return sample_tokens


def wrap_take_draft_token_ids(take: Any) -> Any:
    drafter_is_ours = runner_hooks.drafter_is_ours

    def take_draft_token_ids(self):  # noqa: ANN001 - vLLM signature
        pending = self.__dict__.pop(_DEFERRED, None)
        if pending is not None:
            propose, args, kwargs = pending
            self._draft_token_ids = propose(*args, **kwargs)
            self._copy_draft_token_ids_to_cpu(args[0])
        out = take(self)
        hint = self.drafter.plan_hint() if out is not None and drafter_is_ours(self) else None
        if hint is not None:
            setattr(out, HINT_ATTR, hint)
        return out

    return take_draft_token_ids


def _sampled_drafting_later(runner, sample_tokens, args, kwargs):  # noqa: ANN001
    """Run vLLM's sample_tokens with the drafting call captured, not run: the output
    goes back without drafts, and ``take_draft_token_ids`` (post_step's RPC) drafts."""
    own = runner.__dict__.get("propose_draft_token_ids")  # an instance-level wrapper stays
    propose = runner.propose_draft_token_ids

    def capture(*args, **kwargs):  # noqa: ANN001 - vLLM signature
        runner.__dict__[_DEFERRED] = (propose, args, kwargs)
        counts["deferred"] += 1
        return [[] for _ in runner.input_batch.req_ids]

    runner.propose_draft_token_ids = capture
    try:
        return sample_tokens(runner, *args, **kwargs)
    finally:
        if own is None:
            del runner.propose_draft_token_ids
        else:
            runner.propose_draft_token_ids = own


def wrap_update_from_output(update_from_output: Any) -> Any:
    def update_from_output_(self, scheduler_output, model_runner_output):  # noqa: ANN001
        carried = model_runner_output.__dict__.pop(ATTR, None) \
            if hasattr(model_runner_output, "__dict__") else None
        result = update_from_output(self, scheduler_output, model_runner_output)
        if carried is not None:
            if carried[0] is not None:
                self.update_draft_token_ids(carried[0])
            setattr(self, _APPLIED, True)
            counts["carried"] += 1
        return result

    return update_from_output_


def wrap_post_step(post_step: Any) -> Any:
    def post_step_(self, model_executed: bool) -> None:
        scheduler = getattr(self, "scheduler", None)
        if getattr(scheduler, _APPLIED, False):
            setattr(scheduler, _APPLIED, False)
            return  # the drafts came with the model output
        if model_executed and getattr(self, "check_for_draft_tokens", False) \
                and not getattr(self, "async_scheduling", True):
            counts["rpc"] += 1
        post_step(self, model_executed)

    return post_step_
