"""Which verify tokens a step keeps when a request is waiting for its first token.

vLLM schedules the running rows' 1 + k tokens before any waiting request, out of the
same token budget, and a step takes time in proportion to its tokens (on a CPU a verify
token costs about what a decode token does). So every verify token in a step that
carries a prefill delays that request's first token, and may push its prefill out of
the budget. The plan therefore gives prefills the budget first and lets verify tokens
lengthen such a step by at most ``TTFT_SLACK`` of its predicted time without them, the
exact sampler's σ included (a step that verifies any draft pays it once).
Within that allowance it keeps the drafts most likely to be accepted: position j of a
row with per-token acceptance α is worth α^j expected tokens.

Prompts that arrive together (speculation finishes rows in the same step more often,
so a closed loop sends their successors together) would share one prefill step and each
wait for all of them. With ``prefill_split`` on (off by default), ``admissions`` admits
them one step at a time where the fitted cost says the prompts already in a step lose
more than the deferred one does. That minimises first-token times only: the deferred
prompt's prefill then falls in the decode of the one admitted before it.

A new request also waits for the step that is running when it arrives, and in a closed
loop (a client that sends its next request when an answer ends) it arrives in the step
right after a request finished. With ``arrival_cap`` on (the default), such a step may
hold only the verify tokens that lengthen it by ``ttft_slack`` of a step carrying the
finished request's prompt, the likeliest size of its client's next
(``arrival_allowance``): the two steps then add at most 2 × ttft_slack of that prefill
step to the new request's first token. Other steps without a prefill
keep every draft: the proposer priced k for them already.
Cutting drafts is always exact: the target verifies a prefix of the same proposal, and
admission order changes only when a request runs, never what it computes.
Pure Python (positions are ranked by ``speedup.best_positions``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_specdec_plugin.speedup import best_positions
from vllm_specdec_plugin.step_cost import StepPrice
from vllm_specdec_plugin.tuning import TTFT_SLACK


@dataclass(frozen=True)
class Row:
    """A running request with ``drafts`` scheduled-to-be-verified tokens; ``alpha`` is
    its per-token acceptance estimate (None: unknown)."""

    req_id: str
    drafts: int
    alpha: float | None = None


def verify_allowance(*, decode_rows: int, prefill_tokens: int, token_budget: int,
                     cost: StepPrice | None, slack: float = TTFT_SLACK) -> int:
    """Verify tokens a step carrying ``prefill_tokens`` may hold: what fits in the token
    budget beside the prefills and decode rows, and (with a cost model) what lengthens
    the step by at most ``slack`` of its time without drafts."""
    room = token_budget - decode_rows - prefill_tokens
    within = _slack_tokens(decode_rows=decode_rows, prefill_tokens=prefill_tokens,
                           cost=cost, slack=slack)
    return max(0, room if within is None else min(room, within))


def _slack_tokens(*, decode_rows: int, prefill_tokens: float, cost: StepPrice | None,
                  slack: float) -> int | None:
    """Verify tokens that, with σ (a step that verifies any pays it once), take at most
    ``slack`` of the predicted time of a step with ``decode_rows`` and
    ``prefill_tokens`` (>= 0); None without a cost fit."""
    if cost is None or cost.per_token_s <= 0:
        return None
    room = slack * cost.seconds(decode_rows, prefill_tokens) - cost.verify_s
    return max(0, math.floor(room / cost.per_token_s))


def keep_drafts(rows: list[Row], *, decode_rows: int, prefill_tokens: int,
                prefilling: int, token_budget: int, cost: StepPrice | None,
                slack: float = TTFT_SLACK) -> dict[str, int]:
    """Drafts to keep per request id, for a step about to be scheduled.

    rows: running requests holding drafts. decode_rows: running requests past their
    prompt (each runs 1 token besides its drafts). prefill_tokens: prompt tokens the
    step will prefill (running chunks and admissible waiting requests, capped to the
    budget). prefilling: how many requests those are; 0 keeps every draft.
    """
    if prefilling <= 0:
        return {r.req_id: r.drafts for r in rows}
    allowance = verify_allowance(decode_rows=decode_rows, prefill_tokens=prefill_tokens,
                                 token_budget=token_budget, cost=cost, slack=slack)
    return _likeliest(rows, allowance)


def arrival_allowance(*, decode_rows: int, prompt_tokens: float, cost: StepPrice | None,
                      slack: float = TTFT_SLACK) -> int | None:
    """Verify tokens a step without a prefill may hold when a new request will likely
    wait for it: those that lengthen it by at most ``slack`` of the predicted time of a
    step carrying ``decode_rows`` and a prompt of ``prompt_tokens``. None: no cost fit."""
    return _slack_tokens(decode_rows=decode_rows, prefill_tokens=prompt_tokens,
                         cost=cost, slack=slack)


def keep_for_arrival(rows: list[Row], *, decode_rows: int, prompt_tokens: float,
                     cost: StepPrice | None, slack: float = TTFT_SLACK) -> dict[str, int]:
    """Drafts to keep per request id in a step a new request will likely wait for
    (``arrival_allowance``); every draft without a cost fit."""
    allowance = arrival_allowance(decode_rows=decode_rows, prompt_tokens=prompt_tokens,
                                  cost=cost, slack=slack)
    if allowance is None:
        return {r.req_id: r.drafts for r in rows}
    return _likeliest(rows, allowance)


def _likeliest(rows: list[Row], allowance: int) -> dict[str, int]:
    """Up to ``allowance`` drafts over ``rows``, the positions most likely accepted."""
    known = [r.alpha for r in rows if r.alpha is not None]
    default = sum(known) / len(known) if known else 0.5
    # every verify token costs the same here: the likeliest positions, α^j, first
    kept = best_positions([(min(max(r.alpha if r.alpha is not None else default, 0.0), 1.0),
                            r.drafts, 1.0) for r in rows], allowance)
    return {r.req_id: k for r, k in zip(rows, kept)}


def admissions(prompt_tokens: list[int], *, prefilling: int, decode_rows: int,
               cost: StepPrice | None) -> int:
    """How many of the admissible waiting requests (vLLM's order; ``prompt_tokens``: each
    one's uncomputed prompt tokens) the step should admit.

    Prompt i (P tokens) in this step delays the first token of each of the n prompts
    already in it by p·P. Left to the next step, it and the w - 1 waiting behind it
    wait that step's fixed time f = a + (b + q)·(decode_rows + n) once more. It joins while
    p·P·n ≤ f·w: the greedy rule for the sum of first-token times (for equal prompts it
    splits a burst of m into steps of about m·f / (p·P + f)). On a CPU, where a step's
    time grows with its prompt tokens, two or three prompts that arrive together are
    prefilled one per step; where prompt tokens cost little beside a step's fixed time
    every one is admitted, as vLLM does. ``prefilling``: running requests whose prompt
    is still being prefilled (prompts in the step already). Without a cost fit: all.
    """
    if cost is None or cost.per_prefill_token_s <= 0:
        return len(prompt_tokens)
    n = prefilling
    for i, tokens in enumerate(prompt_tokens):
        fixed = cost.seconds(decode_rows + n)
        behind = len(prompt_tokens) - i
        if n > 0 and cost.per_prefill_token_s * tokens * n > fixed * behind:
            return i
        n += 1
    return len(prompt_tokens)
