"""The step plan at vLLM's scheduler: prefills first, then the drafts worth verifying.

Why: vLLM 0.32's ``Scheduler.schedule`` gives the running rows their 1 + k tokens
  before it admits any waiting request, out of one token budget, and the worker sees
  neither the waiting queue nor the budget. Under load a new request's first token
  then waits for every row's verification (measured: median TTFT 2.2-7.5x no
  speculation at concurrency >= 8 on the bench and nopay pairs, 2026-11-25).
How: ``Scheduler.schedule`` is wrapped (installed from ``register()``; a pass-through
  unless the scheduler's config selects our proposer with ``step_plan`` on). Before
  vLLM schedules, when a running request is still prefilling or a waiting one can be
  admitted, the running requests' ``spec_token_ids`` are cut to what
  ``step_plan.keep_drafts`` keeps (a prefix of each proposal: exact). With
  ``arrival_cap`` on, a step scheduled after requests finished (vLLM's
  ``finished_req_ids``, cleared by each ``schedule``) and carrying no prefill is cut
  to ``step_plan.keep_for_arrival``: a closed loop's next request arrives while it
  runs. It is priced with the prompt the finished requests prefilled in their first
  step (``scheduled_new_reqs``; the next request comes from the client whose answer
  ended): no state outlives a request, so one tenant's prompts never price another's
  later steps. After it
  schedules, the SchedulerOutput carries ``specdec_first_tokens``: the ids whose
  prompt completes in this step, so the worker can return their first token before it
  drafts (``draft_ids_return``), and
  ``specdec_prompts_next``: whether a prompt is still unfinished or a waiting request
  can be admitted, so the next step carries a prefill whose drafts the plan would cut;
  the worker then skips this step's draft round (it would only delay that prompt).
  With ``prefill_split`` on, ``step_plan.admissions`` may admit fewer waiting
  requests than vLLM would: ``max_num_active_reqs`` (vLLM's admission cap) is lowered
  to the running count plus that number for the one ``schedule`` call, and restored.
  ``Scheduler.update_draft_token_ids`` is wrapped to read the worker's plan hint
  (``HINT_ATTR`` on the DraftTokenIds: per-request acceptance and the fitted step
  cost). Kept and cut verify tokens count in ``specdec_step_plan_verify_tokens_total``.
Upstream: a scheduler policy for speculative tokens that knows the waiting queue
  (vLLM schedules running requests' drafts unconditionally), and admission of waiting
  prompts by step cost (vLLM admits all its token budget holds).
Remove when: vLLM budgets draft tokens against waiting prefills itself; the admission
  half when vLLM's scheduler can cap the prompts a step takes by cost.
"""

from __future__ import annotations

import sys
from typing import Any, Iterator

from vllm_specdec_plugin import step_plan

FIRST_TOKENS_ATTR = "specdec_first_tokens"  # on SchedulerOutput: frozenset of req ids
PROMPTS_NEXT_ATTR = "specdec_prompts_next"  # on SchedulerOutput: the next step carries a prompt
HINT_ATTR = "specdec_plan_hint"  # on DraftTokenIds: (StepPrice | None, {req_id: alpha})
_HINT = "_specdec_plan_hint"     # on the Scheduler: the latest hint
_METRICS = "_specdec_plan_metrics"
_SLACK = "_specdec_plan_slack"  # on the Scheduler: ttft_slack, None when off
_SPLIT = "_specdec_plan_split"  # on the Scheduler: prefill_split
_ARRIVAL = "_specdec_plan_arrival"  # on the Scheduler: arrival_cap
_PROMPTS = "_specdec_plan_prompts"  # on the Scheduler: {req id: first-step prefill tokens}
_installed = False
# This process's kept / cut verify tokens in steps the plan decided (tests read them).
counts = {"kept": 0, "cut": 0, "steps": 0, "deferred": 0, "arrival": 0}


def install_engine() -> None:
    """Wrap Scheduler.schedule and Scheduler.update_draft_token_ids (idempotent). Only
    where vLLM's EngineCore module is loaded (as ``request_scope.install_engine``)."""
    global _installed
    if _installed or "vllm.v1.engine.core" not in sys.modules:
        return
    from vllm.v1.core.sched.scheduler import Scheduler

    schedule, update_draft = Scheduler.schedule, Scheduler.update_draft_token_ids

    def schedule_(self, *args, **kwargs):  # noqa: ANN001
        if not enabled(self):
            return schedule(self, *args, **kwargs)
        admit = _plan(self)
        if admit is None:
            out = schedule(self, *args, **kwargs)
        else:
            # vLLM admits waiting requests while the active count is below this cap;
            # lowering it for one call admits exactly ``admit`` of them (restored after).
            cap = self.max_num_active_reqs
            self.max_num_active_reqs = min(cap, _active(self) + admit)
            try:
                out = schedule(self, *args, **kwargs)
            finally:
                self.max_num_active_reqs = cap
        note_prompts(self, out)
        setattr(out, FIRST_TOKENS_ATTR, first_tokens(self, out))
        setattr(out, PROMPTS_NEXT_ATTR, prompts_next(self))
        return out

    def update_draft_token_ids_(self, draft_token_ids):  # noqa: ANN001
        hint = getattr(draft_token_ids, HINT_ATTR, None)
        if hint is not None:
            setattr(self, _HINT, hint)
        return update_draft(self, draft_token_ids)

    schedule_.__wrapped__ = schedule  # type: ignore[attr-defined]
    update_draft_token_ids_.__wrapped__ = update_draft  # type: ignore[attr-defined]
    Scheduler.schedule = schedule_
    Scheduler.update_draft_token_ids = update_draft_token_ids_
    _installed = True


def enabled(scheduler: Any) -> bool:
    """Our proposer is configured with ``step_plan`` on (cached on the scheduler)."""
    return _slack(scheduler) is not None


def _slack(scheduler: Any) -> float | None:
    """The configured ``ttft_slack`` when the step plan is on, else None (cached)."""
    if not hasattr(scheduler, _SLACK):
        from vllm_specdec_plugin.compat.request_scope import ours
        from vllm_specdec_plugin.config import from_vllm_config

        slack, split, arrival = None, False, False
        if ours(scheduler):
            config = from_vllm_config(scheduler.vllm_config)
            slack = config.ttft_slack if config.step_plan else None
            split = config.step_plan and config.prefill_split
            arrival = config.step_plan and config.arrival_cap
        setattr(scheduler, _SLACK, slack)
        setattr(scheduler, _SPLIT, split)
        setattr(scheduler, _ARRIVAL, arrival)
    return getattr(scheduler, _SLACK)


def _active(scheduler: Any) -> int:
    """What vLLM counts against ``max_num_active_reqs`` (running + paused streams)."""
    return len(scheduler.running) + int(getattr(scheduler, "num_waiting_for_streaming_input", 0))


def _plan(scheduler: Any) -> int | None:
    """Cut the running requests' drafts for the step about to be scheduled; return how
    many waiting requests it may admit (None: as many as vLLM admits)."""
    arrival_prompt = finished_prompt(scheduler)
    running = list(scheduler.running)
    budget = int(scheduler.max_num_scheduled_tokens)
    prefill_tokens = prefilling = decode_rows = 0
    rows = []
    cost, alphas = getattr(scheduler, _HINT, (None, {}))
    for req in running:
        if _prefilling(req):
            prefilling += 1
            prefill_tokens += req.num_tokens - req.num_computed_tokens
            continue
        decode_rows += 1
        if req.spec_token_ids:
            rows.append(step_plan.Row(req.request_id, len(req.spec_token_ids),
                                      alphas.get(req.request_id)))
    # an upper bound: prefix-cache hits are known only once it is scheduled
    waiting = [req.num_tokens - req.num_computed_tokens for req in _admissible(scheduler)]
    admit = None
    if getattr(scheduler, _SPLIT, False) and waiting and (prefilling or len(waiting) > 1):
        n = step_plan.admissions(waiting, prefilling=prefilling, decode_rows=decode_rows,
                                 cost=cost)
        if n < len(waiting):
            admit = n
            counts["deferred"] += len(waiting) - n
            _metrics(scheduler).prompts_deferred(len(waiting) - n)
            waiting = waiting[:n]
    prefilling += len(waiting)
    prefill_tokens += sum(waiting)
    if not rows:
        return admit
    if prefilling:
        keep = step_plan.keep_drafts(rows, decode_rows=decode_rows,
                                     prefill_tokens=min(prefill_tokens, budget),
                                     prefilling=prefilling, token_budget=budget, cost=cost,
                                     slack=_slack(scheduler))
    elif arrival_prompt is not None and getattr(scheduler, _ARRIVAL, False):
        keep = step_plan.keep_for_arrival(rows, decode_rows=decode_rows,
                                          prompt_tokens=arrival_prompt,
                                          cost=cost, slack=_slack(scheduler))
        counts["arrival"] += 1
    else:
        return admit
    kept = cut = 0
    for req in running:
        n = keep.get(req.request_id)
        if n is None:
            continue
        kept += n
        cut += len(req.spec_token_ids) - n
        if n < len(req.spec_token_ids):
            req.spec_token_ids = req.spec_token_ids[:n]
    counts["kept"] += kept
    counts["cut"] += cut
    counts["steps"] += 1
    _metrics(scheduler).verify_tokens(kept, cut)
    return admit


def note_prompts(scheduler: Any, out: Any) -> None:
    """Record the tokens each request new in ``out`` prefills in its first step (kept
    until it finishes, ``finished_prompt``); nothing when ``arrival_cap`` is off."""
    if not getattr(scheduler, _ARRIVAL, False):
        return
    prompts = getattr(scheduler, _PROMPTS, None)
    if prompts is None:
        prompts = {}
        setattr(scheduler, _PROMPTS, prompts)
    for new in out.scheduled_new_reqs:
        prompts[new.req_id] = out.num_scheduled_tokens.get(new.req_id, 0)


def finished_prompt(scheduler: Any) -> float | None:
    """Forget the requests that finished since the last step was scheduled (vLLM's
    ``finished_req_ids``) and return the mean of what they prefilled in their first
    step: the prompt a closed loop's next request likely brings. None: none finished."""
    prompts = getattr(scheduler, _PROMPTS, None) or {}
    seen = [prompts.pop(rid) for rid in scheduler.finished_req_ids if rid in prompts]
    return sum(seen) / len(seen) if seen else None


def prompts_next(scheduler: Any) -> bool:
    """After ``schedule``: a running request's prompt is unfinished, or a waiting one
    has a free slot, so the next step will carry a prefill (requests that finish in
    this step, or arrive before the next, are not known yet)."""
    return any(_prefilling(r) for r in scheduler.running) \
        or next(_admissible(scheduler), None) is not None


def _prefilling(req: Any) -> bool:
    """Its prompt is not yet all computed (a chunked prefill in progress)."""
    return req.num_computed_tokens < req.num_prompt_tokens


def _admissible(scheduler: Any) -> Iterator[Any]:
    """The waiting requests the free slots admit next, in vLLM's order (requests
    holding KV first); lazily, so a yes/no question reads one."""
    slots = scheduler.max_num_active_reqs - _active(scheduler)
    for queue in (scheduler.kv_holding_waiting, scheduler.waiting):
        for req in queue:
            if slots <= 0:
                return
            slots -= 1
            yield req


def read_prompts_next(scheduler_output: Any) -> bool:
    """What ``prompts_next`` marked on a SchedulerOutput (False when not attached)."""
    return bool(getattr(scheduler_output, PROMPTS_NEXT_ATTR, False))


def first_tokens(scheduler: Any, out: Any) -> frozenset[str]:
    """Ids of the requests whose prompt this step completes (they sample a first token)."""
    ids = set()
    for rid, n in out.num_scheduled_tokens.items():
        req = scheduler.requests.get(rid)
        # num_computed_tokens already counts this step's tokens (vLLM advances it in
        # schedule()); a first token needs the whole prompt and no output yet.
        if req is not None and req.num_output_tokens == 0 \
                and req.num_computed_tokens >= req.num_prompt_tokens \
                and req.num_computed_tokens - n < req.num_prompt_tokens:
            ids.add(rid)
    return frozenset(ids)


def read_first_tokens(scheduler_output: Any) -> frozenset[str] | None:
    """The ids ``first_tokens`` marked on a SchedulerOutput; None when not attached."""
    return getattr(scheduler_output, FIRST_TOKENS_ATTR, None)


def _metrics(scheduler: Any):
    m = getattr(scheduler, _METRICS, None)
    if m is None:
        from vllm_specdec_plugin.metrics import PlanMetrics

        mc = scheduler.vllm_config.model_config
        m = PlanMetrics(str(getattr(mc, "served_model_name", None) or mc.model))
        setattr(scheduler, _METRICS, m)
    return m
