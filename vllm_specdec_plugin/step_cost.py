"""The cost model of one engine step, fitted online from the step timers (pure Python).

Four parts, all in seconds:

- **target**: T(n, m, R) = a + b·n + p·m + q·R for a target step carrying n
  decode/verify tokens over R decoding rows and m prefill tokens (``target_fit``).
- **draft**: a draft round of P forwards over N tokens in all takes P·a_d + N·b_d
  (``DraftFit``).
- **catch-up**: a round's first pass, which feeds the committed tokens the draft has
  not seen, takes a_c + b_c·N for N tokens fed (``catch_up.CatchUpFit``).
- **σ host time**: seconds a verifying step adds on the host (the exact rejection
  sampler): the median of the last ``SPEC_WINDOW`` measurements, the first skipped
  (it pays one-time set-up).

The controller reads the step without prefill: ``step_time(n, rows=R)``, and in plain
steps at batch B: ``load_cost`` v(B), ``fixed_cost`` σ(B), ``c_prime`` c'(B),
``catch_up_cost`` (one token fed), and ``catch_up_room``, the tokens a draft round may
feed before it delays the step by more than ``CATCH_UP_STEP_MAX`` plain steps.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from vllm_specdec_plugin.catch_up import CatchUpFit
from vllm_specdec_plugin.target_fit import TargetFit
from vllm_specdec_plugin.tuning import (CATCH_UP_STEP_MAX, DRAFT_FIT_EMA, MIN_DET,
                                        SPEC_WINDOW, STEP_FIT_DECAY)


@dataclass(frozen=True)
class StepPrice:
    """Predicted target step time T = a + b·(decode + verify tokens) + q·(decode rows)
    + p·(prefill tokens) (``TargetFit``), and σ, what a step adds once it verifies any
    draft (the exact sampler): what the step plan reads."""

    intercept_s: float           # a
    per_token_s: float           # b: one decode or verify token
    per_prefill_token_s: float   # p: one prompt token
    per_row_s: float = 0.0       # q: a decoding row beyond its token
    verify_s: float = 0.0        # σ: seconds a verifying step adds (0: not measured)

    def seconds(self, tokens: int, prefill_tokens: int = 0, rows: int | None = None) -> float:
        """``rows`` decoding rows (None: one per token, no drafts)."""
        return self.intercept_s + self.per_token_s * tokens \
            + self.per_prefill_token_s * prefill_tokens \
            + self.per_row_s * (tokens if rows is None else rows)


class DraftFit:
    """Draft round seconds ≈ P·a_d + N·b_d for P forwards over N tokens in all,
    fit by exponentially weighted least squares without intercept (forgetting
    ``forget`` per round), a_d, b_d >= 0. While every round so far had the same
    N/P the two cannot be told apart: then b_d = 0 (a forward costs what it cost).
    The caller books drafting passes only: a pass 1 that catches up a lazy prefill is
    left out (``draft/batch.py``), since while b_d is unidentified its prompt tokens
    would read as dearer forwards."""

    __slots__ = ("forget", "pp", "pn", "nn", "py", "ny", "fit")

    def __init__(self, forget: float) -> None:
        self.forget = forget
        self.pp = self.pn = self.nn = self.py = self.ny = 0.0
        self.fit: tuple[float, float] | None = None  # (a_d s/forward, b_d s/token)

    def add(self, seconds: float, passes: int, tokens: int) -> None:
        f, p, n = self.forget, float(passes), float(tokens)
        self.pp = f * self.pp + p * p
        self.pn = f * self.pn + p * n
        self.nn = f * self.nn + n * n
        self.py = f * self.py + p * seconds
        self.ny = f * self.ny + n * seconds
        det = self.pp * self.nn - self.pn * self.pn
        a = b = -1.0
        if det > MIN_DET * self.pp * self.nn:  # N/P has varied: both identifiable
            a = (self.py * self.nn - self.ny * self.pn) / det
            b = (self.pp * self.ny - self.pn * self.py) / det
        if b < 0:  # not identifiable, or noise: all on the forward
            a, b = self.py / self.pp, 0.0
        elif a < 0:
            a, b = 0.0, self.ny / self.nn
        self.fit = (a, b)


class StepCost:
    """Target step time, draft round time and σ host time, fitted online.

    ``fit_decay``: weight kept by past target steps per step; ``ema``: weight of the
    newest draft round in the draft fit."""

    def __init__(self, fit_decay: float = STEP_FIT_DECAY, ema: float = DRAFT_FIT_EMA) -> None:
        self.target = TargetFit(fit_decay)
        self.draft = DraftFit(1.0 - ema)
        self.catch_up = CatchUpFit(1.0 - ema)
        self._spec_s: float | None = None  # seconds a verifying step adds (σ·T)
        self._spec_samples: deque[float] = deque(maxlen=SPEC_WINDOW)
        self._spec_first_seen = False
        self._price: tuple[tuple[int, float | None], StepPrice] | None = None  # cache

    # -- observations -------------------------------------------------------------
    def observe_target_step(self, seconds: float, num_tokens: int, prefill_tokens: int = 0,
                            rows: int | None = None) -> None:
        """One target forward: wall seconds (less σ's host time), ``num_tokens``
        decode/verify tokens over ``rows`` decoding rows (None: one row per token, a
        plain step) and ``prefill_tokens`` prefill tokens in the step."""
        rows = num_tokens if rows is None else rows
        if not seconds >= 0 or num_tokens < 0 or prefill_tokens < 0 \
                or num_tokens + prefill_tokens < 1 or not 0 <= rows <= num_tokens:
            raise ValueError(f"need seconds >= 0, tokens >= 0 (at least one) and 0 <= rows "
                             f"<= tokens, got {seconds!r}, {num_tokens!r}, {prefill_tokens!r}, "
                             f"{rows!r}")
        self.target.add(seconds, num_tokens, prefill_tokens, rows)

    def observe_draft_step(self, seconds: float, num_forwards: int, num_tokens: int) -> None:
        """One draft round: wall seconds of ``num_forwards`` forwards that ran
        ``num_tokens`` tokens in all (catch-up prefill plus one per drafting row per
        later forward)."""
        if not seconds >= 0 or num_forwards < 0 or num_tokens < num_forwards:
            raise ValueError(f"bad draft step: seconds={seconds!r}, forwards={num_forwards!r}, "
                             f"tokens={num_tokens!r}")
        if num_forwards:
            self.draft.add(seconds, num_forwards, num_tokens)

    def observe_catch_up(self, seconds: float, num_tokens: int) -> None:
        """A draft round's first pass: wall seconds to feed ``num_tokens`` committed
        tokens (every row's catch-up, at least one token a row)."""
        if not seconds >= 0 or num_tokens < 1:
            raise ValueError(f"bad catch-up pass: seconds={seconds!r}, tokens={num_tokens!r}")
        self.catch_up.add(seconds, num_tokens)

    def observe_spec_overhead(self, seconds: float) -> None:
        """Seconds a step spent on what only a verifying step runs (the exact
        rejection sampler), measured on a step that verified drafts."""
        if not seconds >= 0:
            raise ValueError(f"need seconds >= 0, got {seconds!r}")
        if not self._spec_first_seen:  # the first exact call imports and allocates
            self._spec_first_seen = True
            return
        self._spec_samples.append(seconds)
        self._spec_s = statistics.median(self._spec_samples)

    # -- predictions, seconds -----------------------------------------------------
    def price(self) -> StepPrice | None:
        """The fitted target step as a ``StepPrice``; None before any target step."""
        t = self.target
        if t.a is None:
            return None
        key = (t.version, self._spec_s)  # read ~10 times a step: built once per solve
        if self._price is None or self._price[0] != key:
            self._price = key, StepPrice(t.a, t.b, t.p, t.q, self._spec_s or 0.0)
        return self._price[1]

    def step_time(self, num_tokens: float, prefill_tokens: float = 0,
                  rows: float | None = None) -> float | None:
        """Fitted target step seconds with ``num_tokens`` decode/verify tokens over
        ``rows`` rows (None: a plain step, one row per token) and ``prefill_tokens``
        prefill tokens; None before any target step."""
        price = self.price()
        return None if price is None else price.seconds(num_tokens, prefill_tokens, rows)

    def draft_round_time(self, num_forwards: int, num_tokens: int) -> float | None:
        """Fitted seconds of a draft round (P forwards over N tokens); None unmeasured."""
        fit = self.draft.fit
        return None if fit is None else fit[0] * num_forwards + fit[1] * num_tokens

    def spec_seconds(self) -> float | None:
        """σ's host seconds per verifying step; None until measured."""
        return self._spec_s

    # -- in plain steps at batch B (what the controller reads) --------------------
    def fixed_cost(self, batch_size: int) -> float:
        """σ(B): the fixed cost of a verifying step, in plain steps at batch B (0 unmeasured)."""
        t = self.step_time(batch_size)
        if self._spec_s is None or not t:
            return 0.0
        return self._spec_s / t

    def c_prime(self, batch_size: int) -> float | None:
        """c'(B): one more draft forward over B rows, in plain target steps at that
        batch; None before a draft round and a target fit."""
        t, draft = self.step_time(batch_size), self.draft_round_time(1, batch_size)
        return None if draft is None or not t else draft / t

    def catch_up_cost(self, batch_size: int) -> float:
        """b_c / T(B): feeding the draft one more committed token, in plain steps at
        batch B (0 before a first pass and a target fit)."""
        t, b = self.step_time(batch_size), self.catch_up.per_token()
        return 0.0 if b is None or not t else b / t

    def catch_up_room(self, batch_size: int) -> int | None:
        """Committed tokens one draft round may feed at batch B so that it delays the
        step's rows by at most ``CATCH_UP_STEP_MAX`` plain steps: that share of T(B) /
        b_c, at least B (one a row). Before the first catch-up pass the target's own
        prefill token (p) stands in for b_c: the draft is the smaller model, so that
        feeds less, not more. None where nothing bounds it: a single row (it waits only
        for its own catch-up, which its plan priced) or no fit yet.

        Only the fits enter, never the last step's own seconds: a cap by recent steps
        would let one tenant's traffic move another's drafts (tests/engine/
        test_tenant_isolation.py). A fit that has not seen this batch size can still
        read T(B) long for one round; its surprise solve corrects it a step later."""
        if batch_size <= 1:
            return None
        t, b = self.step_time(batch_size), self.catch_up.per_token()
        if b is None:
            b = self.target.p if t else None
        if not b or not t:
            return None
        return max(batch_size, int(CATCH_UP_STEP_MAX * t / b))

    def load_cost(self, batch_size: int) -> float:
        """v(B) = b·B / T(B): what one more draft token per row adds, in plain steps at
        batch B (0 before a fit)."""
        t = self.step_time(batch_size)
        return 0.0 if not t else self.target.b * batch_size / t

    def snapshot(self) -> dict:
        """a (s), b (s/token), q (s/row), p (s/prefill token), spec_s (s), draft_a (s
        per draft forward), draft_b (s per draft token), catch_up_b (s per committed
        token fed); None where unmeasured."""
        fit = self.draft.fit
        return {"a": self.target.a, "b": self.target.b, "q": self.target.q, "p": self.target.p,
                "spec_s": self._spec_s,
                "draft_a": None if fit is None else fit[0],
                "draft_b": None if fit is None else fit[1],
                "catch_up_b": self.catch_up.per_token()}
