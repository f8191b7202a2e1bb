"""Times each target step and feeds the step cost model and the metrics (pure Python).

A step runs between the scheduler output (``begin``) and the ``propose`` call that
ends it (``end``). Its tokens split in two:

- decode/verify tokens: 1 + the drafts verified, per row that decoded (the rows
  counted too: a row costs more than a verify token);
- prefill tokens: every scheduled token of a row still prefilling (a prompt chunk,
  its last chunk, a preempted request's recompute), plus any scheduled tokens of a
  decoding row beyond 1 + its drafts (``num_scheduled_tokens`` of vLLM's
  ``SchedulerOutput``).

Every step goes to ``StepCost.observe_step`` (the exact sampler's seconds priced apart
as σ), and each decode step without prefill to its rows' time budget
(``RequestState.settle``). When the scheduled counts are unknown, a step with a
prefill row is not recorded. The ``verify``/``plain`` step histogram and σ take
only steps without prefill: a prefill step's time says nothing about decoding, and
its last chunk's rows also sample on the exact path.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from vllm_specdec_plugin.control.cost import StepCost
from vllm_specdec_plugin.tuning import FIT_LOG_S

logger = logging.getLogger("vllm.specdec_plugin")
# One DEBUG line per step (off unless this logger is set to DEBUG, e.g. through vLLM's
# VLLM_LOGGING_CONFIG_PATH: docs/serving-and-tuning.md): the timers and the fit's
# prediction made before the step was observed, to check the cost model on served traffic.
step_log = logging.getLogger("vllm.specdec_plugin.steps")


def split_tokens(sampled_token_ids: list[list[int]], req_ids: list[str],
                 requests: Mapping[str, Any], scheduled: Mapping[str, int] | None
                 ) -> tuple[int, int, int, bool] | None:
    """(decode/verify tokens, prefill tokens, decoding rows, verifies) of the step that
    just ended.

    sampled_token_ids: per row, the tokens the target emitted ([] while prefilling);
    requests: req_id -> RequestState (``seen``: decoded since its (re)prefill,
    ``drafted``: the drafts this step verified); scheduled: req_id -> tokens the
    scheduler gave the row, or None when unknown (then None for a step with prefill).
    """
    n = m = rows = 0
    verify = False
    for row, sampled in enumerate(sampled_token_ids):
        rid = req_ids[row]
        req = requests.get(rid) if sampled else None
        count = None if scheduled is None else scheduled.get(rid)
        if req is None or not req.seen:  # prefilled in this step
            if count is None:
                return None
            m += count
            continue
        d = 1 + len(req.drafted)  # the target ran L+1 .. L+1+k for this row
        verify = verify or bool(req.drafted)
        n += d
        rows += 1
        if count is not None:
            m += max(count - d, 0)
    return n, m, rows, verify


def saved_seconds(emitted: int, rows: int, plain_s: float, step: float) -> float:
    """Target seconds a decode step saved: what plain steps at its ``rows`` (``plain_s``
    each, one token a row) would take for the ``emitted`` tokens, less the step itself
    (``step``: F, its predicted time in plain steps, σ included). Predicted, not
    measured, so that a plain step saves exactly 0 (emitted = rows, F = 1) and timer
    noise books nothing."""
    return plain_s * (emitted / max(rows, 1) - step)


class StepRecorder:
    """The step timer: ``begin`` at the scheduler output, ``end`` in propose()."""

    def __init__(self, cost: StepCost, metrics: Any, tpot_limit: float) -> None:
        self.cost = cost
        self.metrics = metrics  # ProposerMetrics
        self.tpot_limit = tpot_limit  # for the rows' time budget (RequestState.settle)
        self._t0: float | None = None  # when the current engine step began
        self._logged = time.perf_counter()  # when the fit was last logged
        self._scheduled: Mapping[str, int] | None = None
        self._gap = 0.0  # seconds from the last step's end to this one's begin (host, scheduler)
        self._last_end: float | None = None

    def begin(self, scheduled: Mapping[str, int] | None) -> None:
        """The step's target work starts; ``scheduled``: req_id -> scheduled tokens."""
        self._t0 = time.perf_counter()
        self._scheduled = scheduled
        self._gap = 0.0 if self._last_end is None else self._t0 - self._last_end

    def end(self, sampled_token_ids: list[list[int]], req_ids: list[str],
            requests: Mapping[str, Any], exact_s: float) -> float | None:
        """Record the step that just ended; ``exact_s``: its exact sampler seconds.

        Returns the target seconds it saved against plain decoding (``saved``; 0 for a
        step that verified nothing), or None for a step with a prefill or unpriced."""
        if self._t0 is None:
            return None
        now = time.perf_counter()
        seconds = now - self._t0
        self._t0 = None
        self._last_end = now
        split = split_tokens(sampled_token_ids, req_ids, requests, self._scheduled)
        if split is None:
            return None
        n, m, rows, verify = split
        # The exact sampler runs only on verifying (and seeded) steps: priced apart as
        # σ, so the fit sees the forward's cost per token, not a jump at the first draft.
        exact_s = min(exact_s, seconds)
        if step_log.isEnabledFor(logging.DEBUG):
            self._log_step(seconds, exact_s, n, m, rows, verify, sampled_token_ids)
        if n + m:
            self.cost.observe_step(seconds, n, m, rows, exact_s, verify)
        if m:
            return None
        plain, whole = self.cost.step_s(rows), self.cost.step_s(n, rows=rows)
        emitted = sum(len(s) for s in sampled_token_ids)
        saved = None
        if plain and whole:  # F: the step in plain steps at its batch, as the policy priced it
            step = whole / plain + (self.cost.sigma_s(rows) / plain if verify else 0.0)
            for row, sampled in enumerate(sampled_token_ids):
                req = requests.get(req_ids[row]) if sampled else None
                if req is not None:
                    req.settle(len(sampled), step, self.tpot_limit)
            saved = saved_seconds(emitted, rows, plain, step)
        self.metrics.target_step("verify" if verify else "plain", seconds, emitted)
        if now - self._logged > FIT_LOG_S:
            self._logged = now
            self.log_fit(rows)
        return saved

    def _log_step(self, seconds: float, exact_s: float, n: int, m: int, rows: int,
                  verify: bool, sampled_token_ids: list[list[int]]) -> None:
        """The DEBUG step line: measured seconds (target step, exact sampler, host gap
        before it), the tokens, and the fit's prediction before it saw this step."""
        ms = lambda x: "-" if x is None else f"{1e3 * x:.2f}"
        spec = self.cost.sigma_s(rows) if verify else 0.0
        pred = self.cost.step_s(n, m, rows=rows)
        step_log.debug("specdec step: s %s exact %s gap %s | n %d m %d rows %d verify %d emitted %d"
                       " | pred %s plain %s sigma %s", ms(seconds), ms(exact_s), ms(self._gap),
                       n, m, rows, verify, sum(len(t) for t in sampled_token_ids), ms(pred),
                       ms(self.cost.step_s(rows, m)), ms(spec))

    def log_fit(self, batch: int) -> None:
        """One INFO line: the cost fits and the prices they give at ``batch`` rows."""
        f, p = self.cost.snapshot(), self.cost.prices(batch)
        ms = lambda x: "-" if x is None else f"{1e3 * x:.3g}"
        logger.info("specdec: step cost fit: a %s ms + b %s ms/token + q %s ms/row + p %s ms/prefill"
                    " token, σ %s ms, draft catch-up %s ms/token; at B %d in plain steps: %s",
                    ms(f["a"]), ms(f["b"]), ms(f["q"]), ms(f["p"]), ms(f["sigma_s"]),
                    ms(f["catch_up_b"]), batch, p)
