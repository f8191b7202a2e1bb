"""Each new request's ``cache_salt``, and which finished requests were aborted, to the worker.

Why: the finished-request corpus must be scoped like vLLM's prefix cache, by
  ``cache_salt`` (``tenancy``), and must not take aborted requests. The worker sees
  neither: vLLM 0.32's ``NewRequestData`` leaves the salt on the scheduler's
  ``Request``, and ``SchedulerOutput.finished_req_ids`` mixes requests that finished
  with those aborted by ``Scheduler.finish_requests(..., FINISHED_ABORTED)``.
How: two EngineCore-side wrappers, installed from ``register()`` and pass-throughs
  unless the scheduler's config selects our proposer. ``Scheduler.finish_requests``
  notes the ids it aborts. ``Scheduler.schedule`` sets ``specdec_scope = ({req_id:
  cache_salt} for this step's new requests, frozenset(ids aborted since the last
  step))`` on the SchedulerOutput it returns; the output is pickled to worker
  processes, so the attribute arrives (in-process it is the same object). The worker
  reads it with ``read``; an output without it (plugin not registered in the engine
  process) tells the proposer to share nothing.
  vLLM's frontend also aborts requests that a stop string ended (the engine cannot tell
  them apart), so those are not added either.
Upstream: the salt on NewRequestData, and a finish reason with finished_req_ids.
Remove when: the worker gets both from vLLM.
"""

from __future__ import annotations

import sys
from typing import Any

ATTR = "specdec_scope"  # on SchedulerOutput: (dict req_id -> salt | None, frozenset aborted)
_ABORTED = "_specdec_aborted"  # on the Scheduler: ids aborted since the last schedule()
_OURS = "_specdec_ours"  # on the Scheduler: cached "our proposer is configured"
_installed = False


def install_engine() -> None:
    """Wrap Scheduler.schedule and Scheduler.finish_requests (idempotent). Only where
    vLLM's EngineCore module is loaded (as ``draft_ids_return.install_engine``)."""
    global _installed
    if _installed or "vllm.v1.engine.core" not in sys.modules:
        return
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus

    schedule, finish_requests = Scheduler.schedule, Scheduler.finish_requests

    def finish_requests_(self, request_ids, finished_status):  # noqa: ANN001
        finished = finish_requests(self, request_ids, finished_status)
        if finished_status == RequestStatus.FINISHED_ABORTED and ours(self):
            # the requests it aborted (not those already finished)
            getattr(self, _ABORTED).update(r.request_id for r in finished or ())
        return finished

    def schedule_(self, *args, **kwargs):  # noqa: ANN001
        out = schedule(self, *args, **kwargs)
        if ours(self):
            salts = {}
            for new in out.scheduled_new_reqs:
                req = self.requests.get(new.req_id)
                salts[new.req_id] = getattr(req, "cache_salt", None)
            aborted = getattr(self, _ABORTED)
            setattr(out, ATTR, (salts, frozenset(aborted)))
            aborted.clear()
        return out

    finish_requests_.__wrapped__ = finish_requests  # type: ignore[attr-defined]
    schedule_.__wrapped__ = schedule  # type: ignore[attr-defined]
    Scheduler.finish_requests = finish_requests_
    Scheduler.schedule = schedule_
    _installed = True


def ours(scheduler: Any) -> bool:
    """True when the scheduler's config selects our proposer (cached on it)."""
    flag = getattr(scheduler, _OURS, None)
    if flag is None:
        from vllm_specdec_plugin.compat.rejection_adapter import is_ours

        flag = is_ours(getattr(scheduler.vllm_config, "speculative_config", None))
        setattr(scheduler, _OURS, flag)
        setattr(scheduler, _ABORTED, set())
    return flag


def read(scheduler_output: Any) -> tuple[dict[str, str | None], frozenset[str]] | None:
    """(salt per new request id, ids aborted) of one step, or None when the engine
    process did not attach them."""
    return getattr(scheduler_output, ATTR, None)
