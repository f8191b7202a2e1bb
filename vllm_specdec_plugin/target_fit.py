"""The target's step time, T(n, m, R) = a + b·n + p·m + q·R seconds, fitted online
(pure Python; ``StepCost`` holds one).

n: decode/verify tokens (one per decoding row plus its drafts), m: prefill tokens
(prompt chunks, a resumed request's recompute), R: decoding rows. b is what one more
verify token costs; a row costs b + q (its own attention context, sampling, the
runner's per-request work). Fit by exponentially weighted least squares over every step
(forgetting ``decay`` per step), centred (Welford) so nothing cancels. b, p, q >= 0 (a
slower step with less work is noise); a >= ``A_MIN``. A regressor is identifiable when
it varies apart from those before it (n, m, R): in plain steps R = n, so q is not, and
the fit is T = a + b·n + p·m, a row priced as one token; without prefill spread p is
not. An unidentifiable slope keeps its last identified value (0 before one). The sums
update every step; the solve runs when the fit is read and ``STEP_FIT_SOLVE_EVERY``
steps have come since the last, or a step came that the last solve mispredicted by more
than a factor ``STEP_FIT_SURPRISE`` (a batch size it has not seen: the first steps
after a burst of prompts); the first read always solves.
"""

from __future__ import annotations

import itertools

from vllm_specdec_plugin.tuning import (A_MIN, MIN_DET, MIN_VAR_TOKENS, STEP_FIT_SOLVE_EVERY,
                                        STEP_FIT_SURPRISE)


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
        if self._a is not None and self._pending < STEP_FIT_SOLVE_EVERY:
            c = self._coef
            pred = self._a + c[0] * n + c[1] * m + c[2] * rows
            if not pred / STEP_FIT_SURPRISE <= seconds <= pred * STEP_FIT_SURPRISE:
                self._pending = STEP_FIT_SOLVE_EVERY  # the next read solves

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
