"""Each request's ledger for the row bound: slack it has not used yet (pure Python).

``row_slack`` promises that speculation slows no request's time per token by more
than that share of a plain step. Checked one step at a time, any row without drafts
caps the whole step at 1 + row_slack plain steps, and on traffic where most steps
have such a row (chat at c >= 4: few rows find a match in a given step) almost
nothing is verified, while every row would gain from its own turns. A user sees the
request's time per token over its life (TPOT), so the bound is kept on that: per
request,

    credit <- clip(credit + (1 + slack)·n - F, -CREDIT_MAX, CREDIT_MAX)

after every decode step (no prefill) it took part in: n its tokens emitted, F the
step's predicted time in plain steps at that batch (``StepCost``: T(tokens) / T(B),
plus σ when it verified). A step may then take F <= (1 + slack)·E[N_r] + credit_r
for every row r (``speedup.fair_ks``). A plain step adds ``slack``; a row whose drafts
were accepted gains what they saved; one slowed beside others' drafts pays it back
before it is slowed again. ``CREDIT_MAX`` bounds the horizon: no step slows a row by
more than 1 + slack + CREDIT_MAX plain steps, and a row never saves up more.
"""

from __future__ import annotations

from typing import Any, Mapping

from vllm_specdec_plugin.tuning import CREDIT_MAX


def settle(sampled_token_ids: list[list[int]], req_ids: list[str],
           requests: Mapping[str, Any], step: float, slack: float) -> None:
    """Book a decode step without prefill on each of its rows' ``credit``.

    sampled_token_ids: per row, the tokens emitted (rows with none took no part);
    requests: req_id -> RequestState; step: F, the step's predicted time in plain
    steps at its batch size."""
    for row, sampled in enumerate(sampled_token_ids):
        req = requests.get(req_ids[row]) if sampled else None
        if req is not None:
            c = req.credit + (1.0 + slack) * len(sampled) - step
            req.credit = min(max(c, -CREDIT_MAX), CREDIT_MAX)
