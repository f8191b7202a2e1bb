"""The step's draft token ids travel with its sampled tokens, not in a second RPC.

Why: without async scheduling (vLLM 0.32 turns it off for ``custom_class`` proposers,
  and on CPU for every engine), ``EngineCore.post_step`` fetches each step's drafts
  with a separate collective RPC (``take_draft_token_ids``) after
  ``update_from_output``. When the worker runs in its own process (``vllm serve``:
  the multiprocessing executor) that round trip sits on the critical path of every
  step, drafts or not: py-spy put it at 2.8-2.9 % of EngineCore wall time at
  concurrency 16 on the nopay pair (2026-11-24), the size of the gap to no
  speculation that remained with speculation fully backed off.
How: two halves, both pass-throughs unless our proposer is configured.
  Worker: ``GPUModelRunner.sample_tokens`` is wrapped (installed from our proposer's
  constructor); when the runner's drafter is ours and scheduling is synchronous, the
  returned ``ModelRunnerOutput`` carries ``specdec_draft_ids = (DraftTokenIds | None,)``
  from ``runner.take_draft_token_ids()`` (non-destructive: the RPC would return the
  same object). ModelRunnerOutput is pickled between processes, so the attribute
  arrives. EngineCore: ``Scheduler.update_from_output`` and ``EngineCore.post_step``
  are wrapped from ``register()`` (every process; inert without the attribute, which
  only the worker half sets). The first pops the attribute and, after vLLM's update,
  applies the drafts with ``update_draft_token_ids``, exactly what ``post_step`` does
  with the RPC's result (nothing touches the scheduler in between); the second then
  skips the RPC for that step. A step whose output lacks the attribute (batch queue,
  no sampling) takes the RPC as before.
  First tokens: a step that completes a prompt (``scheduler_plan`` marks it on the
  SchedulerOutput, ``runner_hooks`` notes it on the runner) returns its output with
  the drafting captured, not run, and no drafts attached; ``take_draft_token_ids``
  (wrapped) drafts when post_step's RPC asks. EngineCore queues the step's outputs
  before post_step, so the first token leaves before the draft round and the new
  request's draft prefill (the same cut as vLLM pull request 23041 made for async
  scheduling). ``take_draft_token_ids`` also attaches the proposer's ``plan_hint()``
  to the DraftTokenIds for ``scheduler_plan``.
Upstream: ModelRunnerOutput carrying the drafts, or async scheduling that supports
  ``custom_class`` proposers (it returns sampled tokens before drafting).
Remove when: either lands in vLLM.
"""

from __future__ import annotations

import sys

from vllm_specdec_plugin.compat.scheduler_plan import HINT_ATTR

ATTR = "specdec_draft_ids"      # on ModelRunnerOutput: (DraftTokenIds | None,)
FIRST_TOKENS = "_specdec_first_tokens"  # on the runner: this step's first-token ids
_DEFERRED = "_specdec_deferred_propose"  # on the runner: (propose, args, kwargs)
_APPLIED = "_specdec_drafts_applied"   # on the Scheduler: this step's drafts are in
_worker_installed = False
# Steps of this process's engine whose drafts came with the output / needed the RPC,
# and this process's worker steps whose drafting waited for the RPC (tests read them
# in-process; "rpc" stays 0 until a first token defers a step's drafting).
counts = {"carried": 0, "rpc": 0, "deferred": 0}
_engine_installed = False


def install_worker() -> None:
    """Wrap GPUModelRunner.sample_tokens and take_draft_token_ids (idempotent; from our
    proposer's constructor)."""
    global _worker_installed
    if _worker_installed:
        return
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
    from vllm.v1.worker import gpu_model_runner as gmr

    from vllm_specdec_plugin.compat.runner_hooks import drafter_is_ours

    original, take = gmr.GPUModelRunner.sample_tokens, gmr.GPUModelRunner.take_draft_token_ids

    def sample_tokens(self, *args, **kwargs):  # noqa: ANN001 - vLLM signature
        if self.use_async_scheduling or not drafter_is_ours(self):
            return original(self, *args, **kwargs)
        if getattr(self, FIRST_TOKENS, None):
            # A first token leaves with this output; the drafting runs at the RPC.
            return _sampled_drafting_later(self, original, args, kwargs)
        out = original(self, *args, **kwargs)
        if type(out) is ModelRunnerOutput and out is not EMPTY_MODEL_RUNNER_OUTPUT:
            setattr(out, ATTR, (self.take_draft_token_ids(),))
        return out

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

    sample_tokens.__wrapped__ = original  # type: ignore[attr-defined]
    take_draft_token_ids.__wrapped__ = take  # type: ignore[attr-defined]
    gmr.GPUModelRunner.sample_tokens = sample_tokens
    gmr.GPUModelRunner.take_draft_token_ids = take_draft_token_ids
    _worker_installed = True


def _sampled_drafting_later(runner, sample_tokens, args, kwargs):  # noqa: ANN001
    """Run vLLM's sample_tokens with the drafting call captured, not run: the output
    goes back without drafts, and ``take_draft_token_ids`` (post_step's RPC) drafts."""
    own = runner.__dict__.get("propose_draft_token_ids")  # benchmark timers wrap it
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


def install_engine() -> None:
    """Wrap Scheduler.update_from_output and EngineCore.post_step (idempotent; inert
    unless a model output carries drafts). Only where vLLM's EngineCore module is
    already loaded: EngineCore calls ``register()`` from its constructor, before its
    scheduler exists; a worker process never loads it (importing it costs ~1.7 s)."""
    global _engine_installed
    if _engine_installed or "vllm.v1.engine.core" not in sys.modules:
        return
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    update_from_output, post_step = Scheduler.update_from_output, EngineCore.post_step

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

    def post_step_(self, model_executed: bool) -> None:
        scheduler = getattr(self, "scheduler", None)
        if getattr(scheduler, _APPLIED, False):
            setattr(scheduler, _APPLIED, False)
            return  # the drafts came with the model output
        if model_executed and getattr(self, "check_for_draft_tokens", False) \
                and not getattr(self, "async_scheduling", True):
            counts["rpc"] += 1
        post_step(self, model_executed)

    update_from_output_.__wrapped__ = update_from_output  # type: ignore[attr-defined]
    post_step_.__wrapped__ = post_step  # type: ignore[attr-defined]
    Scheduler.update_from_output = update_from_output_
    EngineCore.post_step = post_step_
    _engine_installed = True
