"""The goodput check: does drafting pay, measured over whole steps (pure Python).

The controllers price each step from predictions: acceptance, the target's step fit,
σ. What a prediction misses is measured here instead: the proposer's own host time
(planning every row, n-gram lookups, the draft round, metrics) and what a verifying
step costs the rows it holds. Under heavy load those can eat the whole gain (smol
pair, c = 64: verifying steps emit ~12 % more tokens per target second than plain
ones, yet throughput was 0.96-1.01x of no speculation).

A cycle is the proposer's call that planned a step plus that target step, in
seconds, less the fitted cost of its prefill tokens (``p·m``, ``step_cost``); it
emitted E tokens over B rows.

- Plain cycles (no drafts verified) fit C(B) = a + b·B seconds (``TargetFit``).
- Each verifying cycle adds E to its batch bucket's tokens and c·B/C(B) to its
  plain-equivalent tokens (what plain cycles would have emitted in its time); the
  bucket's gain g = Σ tokens / Σ plain-equivalent tokens, both decaying by
  ``GOODPUT_DECAY`` per verifying cycle. Buckets are powers of two of B.
- Drafting is allowed at batch B unless B's bucket has at least
  ``GOODPUT_MIN_CYCLES`` (decayed) verifying cycles and g < 1 + ``MIN_GAIN``.
- While it is not, every row is held ("goodput") except on trial steps: a stretch of
  ``GOODPUT_TRIAL_STEPS`` steps plans as usual every ``interval`` steps; the interval
  doubles from ``PROBE_EVERY`` to ``PROBE_MAX`` while trials do not pay, and resets
  when one does. A trial's first step also pays the draft's catch-up for the hold,
  so the check errs towards not drafting, which costs nothing (the floor).
"""

from __future__ import annotations

from vllm_specdec_plugin.step_cost import TargetFit
from vllm_specdec_plugin.tuning import (GOODPUT_DECAY, GOODPUT_MIN_CYCLES, GOODPUT_TRIAL_STEPS,
                                        MIN_GAIN, PROBE_EVERY, PROBE_MAX, STEP_FIT_DECAY)


def bucket(batch: int) -> int:
    """Batch bucket: 0 for B = 1, 1 for 2-3, 2 for 4-7, ... (powers of two)."""
    return max(batch, 1).bit_length() - 1


class GoodputCheck:
    """Per-batch-bucket verdict on whether verifying steps pay (module docstring).

    Call order per engine step: ``observe`` (the cycle that just ended), then
    ``allows`` (the step being planned); ``planned`` with the seconds of that
    planning once it is done."""

    def __init__(self, decay: float = GOODPUT_DECAY, min_cycles: float = GOODPUT_MIN_CYCLES,
                 min_gain: float = MIN_GAIN, trial_steps: int = GOODPUT_TRIAL_STEPS,
                 every: int = PROBE_EVERY, most: int = PROBE_MAX) -> None:
        self.decay, self.min_cycles, self.min_gain = decay, min_cycles, min_gain
        self.trial_steps, self.every, self.most = trial_steps, every, most
        self.plain = TargetFit(STEP_FIT_DECAY)  # C(B): plain cycle seconds
        # per bucket: [Σ tokens, Σ plain-equivalent tokens, Σ cycles], decayed
        self._buckets: dict[int, list[float]] = {}
        self._plan_s = 0.0  # seconds of the proposer call that planned the next step
        self._held = 0  # steps held in a row
        self._interval = every
        self._trial_left = 0  # steps of the current trial still to plan as usual
        self._trial: list[float] | None = None  # its cycles' [tokens, plain-equivalent]

    def planned(self, seconds: float) -> None:
        """The proposer call that planned the next step took ``seconds``."""
        self._plan_s = seconds

    def observe(self, target_s: float, rows: int, emitted: int, prefill_s: float,
                verified: bool) -> None:
        """The step that just ended: its target seconds, ``rows`` that emitted
        ``emitted`` tokens, the fitted seconds of its prefill tokens, whether it
        verified drafts."""
        cycle = self._plan_s + target_s - prefill_s
        self._plan_s = 0.0
        if rows < 1 or cycle <= 0:
            return
        if not verified:
            self.plain.add(cycle, rows, 0)
            return
        if self.plain.a is None:
            return  # no baseline yet
        base = self.plain.a + self.plain.b * rows
        plain = cycle * rows / base
        b = self._buckets.setdefault(bucket(rows), [0.0, 0.0, 0.0])
        f = self.decay
        b[0] = f * b[0] + emitted
        b[1] = f * b[1] + plain
        b[2] = f * b[2] + 1.0
        if self._trial is not None:
            self._trial[0] += emitted
            self._trial[1] += plain

    def gain(self, batch: int) -> float | None:
        """g at ``batch``'s bucket: tokens of verifying cycles per token plain cycles
        would emit in their time; None before any."""
        b = self._buckets.get(bucket(batch))
        return None if b is None or b[1] <= 0 else b[0] / b[1]

    def allows(self, batch: int) -> bool:
        """Whether the step about to be planned at ``batch`` rows may draft."""
        if self._trial_left:
            self._trial_left -= 1
            return True
        if self._trial is not None:  # a trial ended: double the interval unless it paid
            tokens, plain = self._trial
            paid = plain > 0 and tokens >= (1.0 + self.min_gain) * plain
            self._interval = self.every if paid else min(2 * self._interval, self.most)
            self._trial = None
        b = self._buckets.get(bucket(batch))
        if b is None or b[2] < self.min_cycles or b[0] >= (1.0 + self.min_gain) * b[1]:
            self._held = 0
            self._interval = self.every
            return True
        self._held += 1
        if self.every and self._held >= self._interval:
            self._held = 0
            self._trial_left = self.trial_steps - 1
            self._trial = [0.0, 0.0]
            return True
        return False

    def snapshot(self) -> dict:
        """For logs: gain per bucket's smallest batch (1, 2, 4, ...), trial interval."""
        return {"gain": {1 << k: round(v[0] / v[1], 3) for k, v in sorted(self._buckets.items())
                         if v[1] > 0},
                "interval": self._interval}
