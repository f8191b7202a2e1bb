"""What the worker tells the scheduler's step plan about the drafts it just proposed.

``compat.scheduler_plan`` runs in the EngineCore process, where neither acceptance nor
step timings are known. With each step's drafts the worker sends the fitted price of
target tokens (``step_cost``) and, per request holding drafts, the per-token
acceptance that priced them: the controller's estimate for its source (n-gram drafts
by their match bucket), else the request's own acceptance so far, shrunk to the prior.
"""

from __future__ import annotations

from typing import Any

from vllm_specdec_plugin.speedup import shrunk_alpha
from vllm_specdec_plugin.step_cost import StepPrice
from vllm_specdec_plugin.tuning import PRIOR_WEIGHT


def plan_hint(proposer: Any) -> tuple[StepPrice | None, dict[str, float]]:
    """(price of target tokens or None before a fit, {req_id: α per draft token})."""
    price = proposer.step_cost.price()
    alphas = {}
    prior = proposer.config.adaptive_prior_alpha
    for rid, req in proposer.requests.items():
        if not req.drafted:
            continue
        c = proposer.controllers.get(req.source)
        if req.source == "ngram" and req.match is not None and c is not None:
            alphas[rid] = proposer.ngram_alpha(rid, req.match)
        elif c is not None:
            alphas[rid] = c.alpha(rid)
        else:
            acc = req.acceptance  # a round's trials: its accepted drafts + its rejection
            trials = acc.accepted + min(acc.rounds, acc.drafted - acc.accepted)
            alphas[rid] = shrunk_alpha(acc.accepted, trials, prior, PRIOR_WEIGHT)
    return price, alphas
