"""The cost model of one engine step, fitted online from the step timers (pure Python).

Three parts, all in seconds:

- **target**: T(n, m) = a + b·n + p·m for a target step carrying n decode/verify
  tokens (one per decoding row plus its drafts) and m prefill tokens (prompt chunks,
  a resumed request's recompute). Fit by exponentially weighted least squares over
  every step (forgetting ``fit_decay`` per step), centred (Welford) so nothing
  cancels. b, p >= 0 (a slower step with fewer tokens is noise); a >= ``A_MIN``.
  Where m has no spread (no prefill seen, or always the same) p is not identifiable
  and the fit is the one-regressor T = a + b·n; where n has none, the last
  identifiable slope stands (0 before one).
- **draft**: a draft round of P forwards over N tokens in all takes P·a_d + N·b_d
  (``DraftFit``).
- **σ host time**: seconds a verifying step adds on the host (the exact rejection
  sampler): the median of the last ``SPEC_WINDOW`` measurements, the first skipped
  (it pays one-time set-up).

The controller reads the step without prefill: ``step_time(n)``, and in plain steps
at batch B: ``load_cost`` v(B), ``fixed_cost`` σ(B), ``c_prime`` c'(B).
"""

from __future__ import annotations

import statistics
from collections import deque

from vllm_specdec_plugin.tuning import (A_MIN, DRAFT_FIT_EMA, MIN_DET, MIN_VAR_TOKENS,
                                        SPEC_WINDOW, STEP_FIT_DECAY)


class TargetFit:
    """T(n, m) = a + b·n + p·m seconds (see the module docstring)."""

    __slots__ = ("decay", "w", "mn", "mm", "mt", "cnn", "cmm", "cnm", "cnt", "cmt",
                 "a", "b", "p", "_b_good", "_p_good")

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.w = 0.0  # Σ weights
        self.mn = self.mm = self.mt = 0.0  # weighted means of n, m, T
        self.cnn = self.cmm = self.cnm = self.cnt = self.cmt = 0.0  # centred co-moments
        self.a: float | None = None  # seconds
        self.b = 0.0  # seconds per decode/verify token
        self.p = 0.0  # seconds per prefill token
        self._b_good: float | None = None  # last identifiable slopes
        self._p_good: float | None = None

    def add(self, seconds: float, n: int, m: int) -> None:
        f = self.decay
        self.w = f * self.w + 1.0
        dn, dm, dt = n - self.mn, m - self.mm, seconds - self.mt
        self.mn += dn / self.w
        self.mm += dm / self.w
        self.mt += dt / self.w
        rn, rm, rt = n - self.mn, m - self.mm, seconds - self.mt
        self.cnn = f * self.cnn + dn * rn
        self.cnt = f * self.cnt + dn * rt
        self.cmm = f * self.cmm + dm * rm
        self.cnm = f * self.cnm + dn * rm
        self.cmt = f * self.cmt + dm * rt
        self._solve()

    def _solve(self) -> None:
        n_ok = self.cnn / self.w > MIN_VAR_TOKENS
        m_ok = self.cmm / self.w > MIN_VAR_TOKENS
        det = self.cnn * self.cmm - self.cnm * self.cnm
        if n_ok and m_ok and det > MIN_DET * self.cnn * self.cmm:
            self._b_good, self._p_good = self._nonneg(det)
        elif n_ok:  # no prefill spread (or it moves with n): p as last seen
            self._b_good = (self.cnt - max(self._p_good or 0.0, 0.0) * self.cnm) / self.cnn
        elif m_ok:
            self._p_good = (self.cmt - max(self._b_good or 0.0, 0.0) * self.cnm) / self.cmm
        self.b = max(self._b_good or 0.0, 0.0)
        self.p = max(self._p_good or 0.0, 0.0)
        self.a = max(self.mt - self.b * self.mn - self.p * self.mm, A_MIN)

    def _nonneg(self, det: float) -> tuple[float, float]:
        """(b, p) minimising the weighted squared error with b, p >= 0."""
        b = (self.cnt * self.cmm - self.cmt * self.cnm) / det
        p = (self.cmt * self.cnn - self.cnt * self.cnm) / det
        if b >= 0 and p >= 0:
            return b, p
        # the optimum lies on an edge: one slope 0, the other its own fit; take the
        # edge that explains more of the variance (cnt²/cnn vs cmt²/cmm)
        gain_b = max(self.cnt, 0.0) ** 2 / self.cnn
        gain_p = max(self.cmt, 0.0) ** 2 / self.cmm
        if gain_b >= gain_p:
            return max(self.cnt / self.cnn, 0.0), 0.0
        return 0.0, max(self.cmt / self.cmm, 0.0)


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
        self._spec_s: float | None = None  # seconds a verifying step adds (σ·T)
        self._spec_samples: deque[float] = deque(maxlen=SPEC_WINDOW)
        self._spec_first_seen = False

    # -- observations -------------------------------------------------------------
    def observe_target_step(self, seconds: float, num_tokens: int, prefill_tokens: int = 0) -> None:
        """One target forward: wall seconds (less σ's host time), ``num_tokens``
        decode/verify tokens and ``prefill_tokens`` prefill tokens in the step."""
        if not seconds >= 0 or num_tokens < 0 or prefill_tokens < 0 \
                or num_tokens + prefill_tokens < 1:
            raise ValueError(f"need seconds >= 0 and tokens >= 0, at least one, got "
                             f"{seconds!r}, {num_tokens!r}, {prefill_tokens!r}")
        self.target.add(seconds, num_tokens, prefill_tokens)

    def observe_draft_step(self, seconds: float, num_forwards: int, num_tokens: int) -> None:
        """One draft round: wall seconds of ``num_forwards`` forwards that ran
        ``num_tokens`` tokens in all (catch-up prefill plus one per drafting row per
        later forward)."""
        if not seconds >= 0 or num_forwards < 0 or num_tokens < num_forwards:
            raise ValueError(f"bad draft step: seconds={seconds!r}, forwards={num_forwards!r}, "
                             f"tokens={num_tokens!r}")
        if num_forwards:
            self.draft.add(seconds, num_forwards, num_tokens)

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
    def step_time(self, num_tokens: float, prefill_tokens: float = 0) -> float | None:
        """Fitted target step seconds with ``num_tokens`` decode/verify tokens and
        ``prefill_tokens`` prefill tokens; None before any target step."""
        t = self.target
        return None if t.a is None else t.a + t.b * num_tokens + t.p * prefill_tokens

    def seconds_per_token(self) -> float | None:
        """b: seconds one more decode/verify token adds to a target step (None: no fit)."""
        return None if self.target.a is None else self.target.b

    def seconds_per_prefill_token(self) -> float | None:
        """p: seconds one more prefill token adds to a target step (None: no fit)."""
        return None if self.target.a is None else self.target.p

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

    def load_cost(self, batch_size: int) -> float:
        """v(B) = b·B / (a + b·B): extra verify cost per draft token, in plain steps
        (0 before a fit)."""
        t = self.target
        if t.a is None:
            return 0.0
        bb = t.b * batch_size
        return bb / (t.a + bb)

    def snapshot(self) -> dict:
        """a (s), b (s/token), p (s/prefill token), spec_s (s), draft_a (s per draft
        forward), draft_b (s per draft token); None where unmeasured."""
        fit = self.draft.fit
        return {"a": self.target.a, "b": self.target.b, "p": self.target.p,
                "spec_s": self._spec_s,
                "draft_a": None if fit is None else fit[0],
                "draft_b": None if fit is None else fit[1]}
