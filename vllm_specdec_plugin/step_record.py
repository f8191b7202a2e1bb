"""Times each target step, scheduler output (``begin``) to ``propose`` (``end``), for the
cost fits (``split_tokens``: decode/verify and prefill tokens), the rows' time budgets and
the metrics (pure Python). Only decode steps without prefill feed σ, the budgets and the
``verify``/``plain`` histogram: a prefill step's time says nothing about decoding."""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from vllm_specdec_plugin.control.cost import StepCost
from vllm_specdec_plugin.tuning import FIT_LOG_S

logger = logging.getLogger("vllm.specdec_plugin")
# One DEBUG line per step (and per draft round: draft/batch.py) when this logger is at
# DEBUG (benchmarks/step_log.json, read by benchmarks/step_log.py): the timers and the
# fit's prediction made before it saw the step, to check the cost model when serving.
step_log = logging.getLogger("vllm.specdec_plugin.steps")


def split_tokens(sampled_token_ids: list[list[int]], req_ids: list[str],
                 requests: Mapping[str, Any], scheduled: Mapping[str, int] | None
                 ) -> tuple[int, int, int, bool] | None:
    """(decode/verify tokens: 1 + drafts a decoding row; prefill tokens: a prefilling row's
    scheduled ones and a decoding row's beyond; decoding rows; verifies), or None for a
    step with prefill when ``scheduled`` (req_id -> tokens) is unknown."""
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
    """Target s a decode step saved: plain steps for ``emitted`` less F (``step``, predicted:
    a plain step saves exactly 0, timer noise books nothing)."""
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
        self._gap = 0.0  # seconds from the last step's end to this one's begin
        self._last_end: float | None = None

    def begin(self, scheduled: Mapping[str, int] | None) -> None:
        """The step's target work starts; ``scheduled``: req_id -> scheduled tokens."""
        self._t0 = time.perf_counter()
        self._scheduled = scheduled
        self._gap = 0.0 if self._last_end is None else self._t0 - self._last_end

    def end(self, sampled_token_ids: list[list[int]], req_ids: list[str],
            requests: Mapping[str, Any], exact_s: float, positions: int = 0) -> float | None:
        """Record the step that ended (``exact_s``: its exact sampler seconds, which made
        ``positions`` sampled positions past each row's first); returns the
        target seconds it saved (``saved_seconds``), None with a prefill or unpriced."""
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
        exact_s = min(exact_s, seconds)  # σ, apart: the fit sees the forward's cost per token
        emitted = sum(len(s) for s in sampled_token_ids)
        if step_log.isEnabledFor(logging.DEBUG):
            self._log_step(seconds, exact_s, n, m, rows, verify, emitted)
        if n + m:
            self.cost.observe_step(seconds, n, m, rows, exact_s, verify, positions)
        if m:
            return None
        plain, whole = self.cost.step_s(rows), self.cost.step_s(n, rows=rows)
        saved = None
        if plain and whole:  # F: the step in plain steps at its batch, as the policy priced it
            step = whole / plain + (self.cost.sigma_s(rows, positions) / plain if verify else 0.0)
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
                  verify: bool, emitted: int) -> None:
        """The DEBUG step line; the prediction is from before the fit saw this step."""
        ms = lambda x: "-" if x is None else f"{1e3 * x:.2f}"
        step_log.debug("specdec step: s %s exact %s gap %s | n %d m %d rows %d verify %d emitted %d"
                       " | pred %s plain %s sigma %s", ms(seconds), ms(exact_s), ms(self._gap),
                       n, m, rows, verify, emitted, ms(self.cost.step_s(n, m, rows=rows)),
                       ms(self.cost.step_s(rows, m)), ms(self.cost.sigma_s(rows) if verify else 0.0))

    def log_fit(self, batch: int) -> None:
        """One INFO line: the cost fits and the prices they give at ``batch`` rows."""
        f, p = self.cost.snapshot(), self.cost.prices(batch)
        ms = lambda x: "-" if x is None else f"{1e3 * x:.3g}"  # noqa: E731
        logger.info("specdec: step cost fit: a %s ms + b %s ms/token + q %s ms/row + p %s ms/prefill"
                    " token, σ %s ms, draft catch-up %s ms/token; at B %d in plain steps: %s",
                    ms(f["a"]), ms(f["b"]), ms(f["q"]), ms(f["p"]), ms(f["sigma_s"]),
                    ms(f["catch_up_b"]), batch, p)
