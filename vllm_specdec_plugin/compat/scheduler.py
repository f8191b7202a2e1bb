"""vLLM's scheduler, where the step policy's decision is applied and the worker told:
the ``Scheduler`` wrappers (why and how: their ``compat.patches`` rows), their state (a
``SchedulerSide``), and the worker's reads of what ``schedule`` attaches."""

from __future__ import annotations

from typing import Any, Iterator

from vllm_specdec_plugin.control import policy

SCOPE_ATTR = "specdec_scope"            # (dict req_id -> salt | None, frozenset aborted)
FIRST_TOKENS_ATTR = "specdec_first_tokens"  # frozenset of req ids
NEXT_PREFILL_ATTR = "specdec_next_prefill"  # int: prompt tokens the next step carries
HINT_ATTR = "specdec_plan_hint"         # on DraftTokenIds: policy.Hint
_SIDE = "_specdec"                      # on the Scheduler: SchedulerSide, or False (not ours)
# This process's kept / cut verify tokens in steps it bounded (tests read them).
counts = {"kept": 0, "cut": 0, "steps": 0, "arrival": 0}


class SchedulerSide:
    """Our state on one Scheduler."""

    def __init__(self, scheduler: Any) -> None:
        mc = scheduler.vllm_config.model_config
        self.model_name = str(getattr(mc, "served_model_name", None) or mc.model)
        self.hint: policy.Hint | None = None
        self.aborted: set[str] = set()
        self.prompts: dict[str, int] = {}  # req id -> tokens it prefilled in its first step
        self._metrics = None

    def metrics(self):
        if self._metrics is None:
            from vllm_specdec_plugin.metrics import PlanMetrics
            self._metrics = PlanMetrics(self.model_name)
        return self._metrics


def wrap_schedule(schedule: Any) -> Any:
    def schedule_(self, *args, **kwargs):  # noqa: ANN001
        side = side_of(self)
        if not side:
            return schedule(self, *args, **kwargs)
        _bound_drafts(self, side)
        out = schedule(self, *args, **kwargs)
        salts = {new.req_id: getattr(self.requests.get(new.req_id), "cache_salt", None)
                 for new in out.scheduled_new_reqs}
        for new in out.scheduled_new_reqs:
            side.prompts[new.req_id] = out.num_scheduled_tokens.get(new.req_id, 0)
        setattr(out, SCOPE_ATTR, (salts, frozenset(side.aborted)))
        side.aborted.clear()
        setattr(out, FIRST_TOKENS_ATTR, first_tokens(self, out))
        setattr(out, NEXT_PREFILL_ATTR, next_prefill(self))
        return out

    return schedule_


def wrap_finish_requests(finish: Any) -> Any:
    from vllm.v1.request import RequestStatus

    def finish_requests_(self, request_ids, finished_status):  # noqa: ANN001
        finished = finish(self, request_ids, finished_status)
        side = side_of(self)
        if side and finished_status == RequestStatus.FINISHED_ABORTED:
            side.aborted.update(r.request_id for r in finished or ())  # not those already done
        return finished

    return finish_requests_


def wrap_update_draft_token_ids(update_draft: Any) -> Any:
    def update_draft_token_ids_(self, draft_token_ids):  # noqa: ANN001
        hint = getattr(draft_token_ids, HINT_ATTR, None)
        side = side_of(self)
        if hint is not None and side:
            side.hint = hint
        return update_draft(self, draft_token_ids)

    return update_draft_token_ids_


def side_of(scheduler: Any) -> SchedulerSide | bool:
    """The scheduler's ``SchedulerSide``, or False when its config is not ours (cached)."""
    side = getattr(scheduler, _SIDE, None)
    if side is None:
        from vllm_specdec_plugin.compat.rejection_adapter import is_ours

        ours = is_ours(getattr(scheduler.vllm_config, "speculative_config", None))
        side = SchedulerSide(scheduler) if ours else False
        setattr(scheduler, _SIDE, side)
    return side


def _bound_drafts(scheduler: Any, side: SchedulerSide) -> None:
    """Cut the running rows' drafts for a step with prompt tokens (an upper bound) or after
    a finished request (its prompt prices the step its client's next one waits for)."""
    finished = [side.prompts.pop(rid) for rid in scheduler.finished_req_ids
                if rid in side.prompts]
    if side.hint is None:
        return
    running = list(scheduler.running)
    prefill = next_prefill(scheduler)  # within the budget, which is >= 1
    budget = int(scheduler.max_num_scheduled_tokens)
    decode_rows = sum(1 for r in running if not _prefilling(r))
    drafting = [r for r in running if r.spec_token_ids and not _prefilling(r)]
    if not drafting or not (prefill or finished):
        return
    if prefill:
        cap = policy.verify_cap(side.hint, decode_rows, prefill)
        room = budget - decode_rows - prefill  # vLLM would cut past its budget anyway
        cap = room if cap is None else min(cap, room)
    else:
        cap = policy.verify_cap(side.hint, decode_rows, sum(finished) / len(finished),
                                beside_prompt=False)
        counts["arrival"] += 1
        if cap is None:
            return
    keep = policy.keep(side.hint, max(cap, 0))
    kept = cut = 0
    for req in drafting:
        n = min(keep.get(req.request_id, 0), len(req.spec_token_ids))
        kept += n
        cut += len(req.spec_token_ids) - n
        if n < len(req.spec_token_ids):
            req.spec_token_ids = req.spec_token_ids[:n]
    counts["kept"] += kept
    counts["cut"] += cut
    counts["steps"] += 1
    side.metrics().verify_tokens(kept, cut)


def next_prefill(scheduler: Any) -> int:
    """Prompt tokens a step will carry as known now (running prompts not yet computed,
    waiting requests a free slot admits), within the token budget."""
    tokens = sum(r.num_tokens - r.num_computed_tokens for r in scheduler.running
                 if _prefilling(r))
    tokens += sum(r.num_tokens - r.num_computed_tokens for r in _admissible(scheduler))
    return min(tokens, int(scheduler.max_num_scheduled_tokens))


def _prefilling(req: Any) -> bool:  # its prompt is not all computed yet
    return req.num_computed_tokens < req.num_prompt_tokens


def _admissible(scheduler: Any) -> Iterator[Any]:
    """The waiting requests the free slots admit next, in vLLM's order."""
    active = len(scheduler.running) + int(getattr(scheduler, "num_waiting_for_streaming_input", 0))
    slots = scheduler.max_num_active_reqs - active
    for queue in (scheduler.kv_holding_waiting, scheduler.waiting):
        for req in queue:
            if slots <= 0:
                return
            slots -= 1
            yield req


def first_tokens(scheduler: Any, out: Any) -> frozenset[str]:
    """Ids of the requests whose prompt this step completes (they sample a first token)."""
    ids = set()
    for rid, n in out.num_scheduled_tokens.items():
        req = scheduler.requests.get(rid)
        # num_computed_tokens already counts this step's tokens (schedule() advanced it);
        # a first token needs the whole prompt and no output yet.
        if req is not None and req.num_output_tokens == 0 \
                and req.num_computed_tokens >= req.num_prompt_tokens \
                and req.num_computed_tokens - n < req.num_prompt_tokens:
            ids.add(rid)
    return frozenset(ids)


def read_scope(scheduler_output: Any) -> tuple[dict[str, str | None], frozenset[str]] | None:
    """(salt per new request id, ids aborted), None if not attached (no plugin there)."""
    return getattr(scheduler_output, SCOPE_ATTR, None)


def read_first_tokens(scheduler_output: Any) -> frozenset[str] | None:
    return getattr(scheduler_output, FIRST_TOKENS_ATTR, None)


def read_next_prefill(scheduler_output: Any) -> int:
    return int(getattr(scheduler_output, NEXT_PREFILL_ATTR, 0) or 0)
