"""The cost model of one engine step, fitted online from the step timers (pure Python).

Four parts, all in seconds:

- **target**: T(n, m, R) = a + b·n + p·m + q·R for a target step carrying n
  decode/verify tokens (one per decoding row plus its drafts) over R decoding rows, and
  m prefill tokens (prompt chunks, a resumed request's recompute). b is what one more
  verify token costs; a row costs b + q (its own attention context, sampling, the
  runner's per-request work). Fit by exponentially weighted least squares over every step
  (forgetting ``fit_decay`` per step), centred (Welford) so nothing cancels. b, p,
  q >= 0 (a slower step with less work is noise); a >= ``A_MIN``. A regressor is
  identifiable when it varies apart from those before it (n, m, R): in plain steps
  R = n, so q is not, and the fit is T = a + b·n + p·m, a row priced as one token;
  without prefill spread p is not. An unidentifiable slope keeps its last identified
  value (0 before one). The sums update every step; the solve runs when the fit is
  read and ``STEP_FIT_SOLVE_EVERY`` steps have come since the last (the first read
  always solves).
- **draft**: a draft round of P forwards over N tokens in all takes P·a_d + N·b_d
  (``DraftFit``).
- **catch-up**: a round's first pass, which feeds the committed tokens the draft has
  not seen, takes a_c + b_c·N for N tokens fed (``catch_up.CatchUpFit``).
- **σ host time**: seconds a verifying step adds on the host (the exact rejection
  sampler): the median of the last ``SPEC_WINDOW`` measurements, the first skipped
  (it pays one-time set-up).

The controller reads the step without prefill: ``step_time(n, rows=R)``, and in plain
steps at batch B: ``load_cost`` v(B), ``fixed_cost`` σ(B), ``c_prime`` c'(B),
``catch_up_cost`` (one token fed).
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from dataclasses import dataclass

from vllm_specdec_plugin.catch_up import CatchUpFit
from vllm_specdec_plugin.tuning import (A_MIN, DRAFT_FIT_EMA, MIN_DET, MIN_VAR_TOKENS,
                                        SPEC_WINDOW, STEP_FIT_DECAY, STEP_FIT_SOLVE_EVERY)


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


class TargetFit:
    """T(n, m, R) = a + b·n + p·m + q·R seconds (see the module docstring)."""

    __slots__ = ("decay", "w", "mean", "cov", "_a", "_coef", "_good", "_pending", "version")

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.w = 0.0  # Σ weights
        self.mean = [0.0] * 4  # weighted means of n, m, R, T
        self.cov = [[0.0] * 4 for _ in range(4)]  # centred co-moments, [i][j] for i <= j
        self._a: float | None = None  # seconds
        self._coef = [0.0, 0.0, 0.0]  # b s/token, p s/prefill token, q s/row
        self._good: list[float | None] = [None, None, None]  # last identifiable slopes
        self._pending = 0  # steps added since the last solve
        self.version = 0  # solves so far (the caller's cache key)

    def _fresh(self) -> None:
        # Solving costs more than the rest of a step's bookkeeping; with ~100 steps of
        # memory, a few steps more or less move the fit by a few per cent.
        if self._pending and (self._a is None or self._pending >= STEP_FIT_SOLVE_EVERY):
            self._solve()

    def solve(self) -> None:
        """Solve now, whatever came since the last solve."""
        if self._pending:
            self._solve()

    @property
    def a(self) -> float | None:
        self._fresh()
        return self._a

    @property
    def coef(self) -> list[float]:
        self._fresh()
        return self._coef

    @property
    def b(self) -> float:
        return self.coef[0]

    @property
    def p(self) -> float:
        return self.coef[1]

    @property
    def q(self) -> float:
        return self.coef[2]

    def add(self, seconds: float, n: int, m: int, rows: int) -> None:
        f = self.decay
        self.w = f * self.w + 1.0
        x = (n, m, rows, seconds)
        d = [x[i] - self.mean[i] for i in range(4)]
        for i in range(4):
            self.mean[i] += d[i] / self.w
        r = [x[i] - self.mean[i] for i in range(4)]
        for i in range(4):
            row = self.cov[i]
            for j in range(i, 4):
                row[j] = f * row[j] + d[i] * r[j]
        self._pending += 1

    def _c(self, i: int, j: int) -> float:
        return self.cov[i][j] if i <= j else self.cov[j][i]

    def _solve(self) -> None:
        # Identifiable regressors, in the order n, m, R: each must vary, and vary apart
        # from those before it (rows move with n in plain steps: q is then not
        # identifiable and the model is T = a + b·n + p·m, a row costing a token).
        ident: list[int] = []
        for i in range(3):
            if self.cov[i][i] / self.w > MIN_VAR_TOKENS and \
                    (not ident or _rel_det(self._c, ident + [i]) > MIN_DET):
                ident.append(i)
        # the others keep their last identifiable slope (0 before one)
        fixed = [(j, max(self._good[j] or 0.0, 0.0)) for j in range(3) if j not in ident]
        rhs = {i: self.cov[i][3] - sum(v * self._c(i, j) for j, v in fixed) for i in ident}
        for i, v in zip(ident, self._nonneg(ident, rhs)):
            self._good[i] = v
        self._coef = [max(g or 0.0, 0.0) for g in self._good]
        a = self.mean[3]
        for i in range(3):
            a -= self._coef[i] * self.mean[i]
        self._a = max(a, A_MIN)
        self._pending = 0
        self.version += 1

    def _nonneg(self, ident: list[int], rhs: dict[int, float]) -> list[float]:
        """Slopes of ``ident`` minimising the weighted squared error, all >= 0: the
        least-squares solution if it is; else, of the subsets whose solution is, the one
        that explains most of the variance (Σ slope·rhs), the rest 0."""
        if not ident:
            return []
        full = _cramer(self._c, ident, rhs)
        if all(v >= 0 for v in full):
            return full
        best, gain = [0.0] * len(ident), 0.0
        for size in range(len(ident) - 1, 0, -1):
            for sub in map(list, itertools.combinations(ident, size)):
                sol = _cramer(self._c, sub, rhs)
                g = sum(v * rhs[i] for i, v in zip(sub, sol))
                if all(v >= 0 for v in sol) and g > gain:
                    gain, best = g, [sol[sub.index(i)] if i in sub else 0.0 for i in ident]
        return best


def _det(m: list[list[float]]) -> float:
    """Determinant of a 1x1-3x3 matrix."""
    if len(m) == 1:
        return m[0][0]
    if len(m) == 2:
        return m[0][0] * m[1][1] - m[0][1] * m[1][0]
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


def _rel_det(c, idx: list[int]) -> float:
    """det / Π variances of the regressors ``idx``: 1 uncorrelated, 0 collinear."""
    prod = 1.0
    for i in idx:
        prod *= c(i, i)
    return _det([[c(i, j) for j in idx] for i in idx]) / prod


def _cramer(c, idx: list[int], rhs: dict[int, float]) -> list[float]:
    """Solve Σ_j c(i, j)·x_j = rhs[i] over ``idx`` by Cramer's rule (idx identifiable)."""
    if len(idx) == 1:
        return [rhs[idx[0]] / c(idx[0], idx[0])]
    if len(idx) == 2:  # written out: the two-regressor fit as it always was
        i, j = idx
        det = c(i, i) * c(j, j) - c(i, j) * c(i, j)
        return [(rhs[i] * c(j, j) - rhs[j] * c(i, j)) / det,
                (rhs[j] * c(i, i) - rhs[i] * c(i, j)) / det]
    m = [[c(i, j) for j in idx] for i in idx]
    det = _det(m)
    return [_det([[rhs[i] if col == k else m[r][col] for col in range(3)]
                  for r, i in enumerate(idx)]) / det for k in range(3)]


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
