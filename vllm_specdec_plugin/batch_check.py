"""Whole-step checks: does a verifying step pay its fixed cost σ, and does it slow no
row by more than ``ROW_SLACK`` and the slack it saved (pure Python)?

σ falls on all B rows of a verifying step, however few draft, so the step as a whole
must pay (``speedup.batch_pays``, by ``step_min_gain``). ``held`` bounds the step
before any row is planned (``speedup.step_may_pay``); ``check`` runs ``fair``, which
cuts the planned drafts so that no row's time per token grows by more than
``ROW_SLACK`` over its life (``speedup.fair_ks`` with ``row_credit``: every request
counts, not the batch's mean), then ``pays`` on what is left. Probe steps are exempt
from all of it (the caller passes ``probing``).

estimates: per draft source (α of a request id, cost per draft token in plain
steps, σ in plain steps) as ``planning.Estimates``; choices: per source, req_id ->
(k, reason-if-0) from the controllers.
"""

from __future__ import annotations

from typing import Any

from vllm_specdec_plugin.match_pricing import lookup_alpha
from vllm_specdec_plugin.speedup import batch_pays, best_net_gain, fair_ks, step_may_pay
from vllm_specdec_plugin.tuning import ROW_SLACK, STEP_MIN_GAIN


def held(req_ids: list[str], batch: int, choices: dict, estimates: dict, k_ceiling: int,
         probing: bool, min_gain: float = STEP_MIN_GAIN) -> dict[str, str] | None:
    """req_id -> reason for every row when no plans could pass ``pays`` (each row at
    the best k its controllers allow, the least σ; min_gain: ``step_min_gain``), else
    None. The reason is "batch"
    for a row whose own drafts could pay (the step as a whole cannot), else its
    controllers' reason.

    An n-gram row is bounded as the planner offers it: at the ceiling k and the
    price of ``match_pricing.lookup_alpha`` (also a row its controller holds for
    "adaptive": a long match may pay where the request's α does not)."""
    if probing:
        return None
    bound = dict.fromkeys(req_ids, 0.0)
    reason = dict.fromkeys(bound, "")
    fixed = None
    for src, (alpha, cost, sigma) in estimates.items():
        for rid, (k, why) in choices[src].items():
            a = lookup_alpha(alpha, rid, k, why) if src == "ngram" else None
            if a is not None:
                k = k_ceiling
            elif k:
                a = alpha(rid)
            if k:
                bound[rid] = max(bound[rid], best_net_gain(a, k, cost, min_gain))
                fixed = sigma if fixed is None else min(fixed, sigma)
            elif not reason[rid]:
                reason[rid] = why
    if fixed is not None and step_may_pay(list(bound.values()), batch, fixed, min_gain):
        return None
    # a row some controller would draft for is held by the batch: "batch"
    return {rid: "batch" if bound[rid] else reason[rid] or "adaptive" for rid in bound}


def pays(plans: list[Any], batch: int, estimates: dict, probing: bool,
         min_gain: float = STEP_MIN_GAIN) -> bool:
    """Whether the planned rows (``planning.Plan``: n-gram if ``drafts``, else the
    model) make the step emit ``min_gain`` more per second than a plain step, all
    ``batch`` rows counted (they all pay its time). Probe steps always pay."""
    if not plans or probing:
        return True
    rows, fixed = _priced(plans, estimates)
    return batch_pays(rows, batch, fixed, min_gain)


def fair(plans: list[Any], batch: int, estimates: dict, probing: bool,
         slack: float = ROW_SLACK, states: list[Any] = ()) -> tuple[list[Any], int]:
    """``plans`` cut (in place: a prefix of each proposal, exact) so that no row of the
    step, drafting or not, is slowed by more than ``slack`` plus the slack it saved
    (``speedup.fair_ks`` with each RequestState's ``credit``: ``row_credit``; states:
    the step's rows, planned or not), and how many plans were cut to no drafts
    (dropped: a draft-model plan's catch-up waits for a round that drafts). Probe
    steps keep every draft."""
    if not plans or probing:
        return plans, 0
    rows, fixed = _priced(plans, estimates)
    kept = []
    planned = {id(p.req) for p in plans}
    idle = min((s.credit for s in states if id(s) not in planned), default=0.0)
    credits = [p.req.credit for p in plans]
    for p, k in zip(plans, fair_ks(rows, batch, fixed, slack, credits, idle)):
        if k <= 0 < p.k:
            continue
        if p.drafts:
            del p.drafts[k:]
        p.k = k
        kept.append(p)
    return kept, len(plans) - len(kept)


def check(plans: list[Any], batch: int, estimates: dict, probing: bool, slack: float,
          min_gain: float, states: list[Any]) -> tuple[list[Any], int, int]:
    """The step's plans after ``fair`` (no row slowed past its bound) and then ``pays``
    (what is left still makes the step ``min_gain`` faster per token: a cut keeps
    every row's time, not the gain): (plans kept, plans cut by ``fair``, plans dropped
    because the rest did not pay)."""
    plans, cut = fair(plans, batch, estimates, probing, slack, states)
    if pays(plans, batch, estimates, probing, min_gain):
        return plans, cut, 0
    return [], cut, len(plans)


def _priced(plans: list[Any], estimates: dict) -> tuple[list[tuple[float, int, float]], float]:
    """Per plan (α, k, cost per draft token) from its source's estimates (n-gram if it
    has ``drafts``, else the model, whose catch-up is shared by its drafts; a priced
    n-gram proposal keeps its own α), and the step's σ: the largest of the sources'
    that draft."""
    rows, fixed = [], 0.0
    for p in plans:
        alpha, cost, sigma = estimates["ngram" if p.drafts else "draft"]
        if p.catch_up and p.k:
            cost += p.catch_up / p.k
        rows.append((alpha(p.req_id) if p.alpha is None else p.alpha, p.k, cost))
        fixed = max(fixed, sigma)
    return rows, fixed
