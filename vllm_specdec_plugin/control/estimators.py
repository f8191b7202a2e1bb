"""The controller's estimators (pure Python): ``DecayedRate`` (acceptance, host time),
``OnlineFit`` (the cost fits), ``Backoff`` (probes)."""

from __future__ import annotations

import itertools

# Numerical floors, not tuning: a weighted variance (in the regressor's units squared)
# below MIN_VAR, or a relative determinant below MIN_DET, makes a slope unidentifiable.
MIN_VAR = 1e-6
MIN_DET = 1e-4


class DecayedRate:
    """num / den over decayed sums: each ``add`` first keeps ``decay`` of the past."""

    __slots__ = ("decay", "num", "den")

    def __init__(self, decay: float) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.decay, self.num, self.den = decay, 0.0, 0.0

    def add(self, num: float, den: float) -> None:
        self.num = self.decay * self.num + num
        self.den = self.decay * self.den + den

    def value(self, prior: float, weight: float) -> float:
        """(weight·prior + num) / (weight + den): the prior counts as ``weight`` of den."""
        return (weight * prior + self.num) / (weight + self.den)


class OnlineFit:
    """y ≈ a + Σ c_i·x_i, weighted least squares forgetting ``decay`` per sample, over
    centred sums (Welford: nothing cancels). A slope is identified when its regressor
    varies apart from the ones before it; an unidentified one keeps its last identified
    value (0 before), so rows that move with tokens are priced as tokens. Slopes >= 0 (a
    slower step with less work is noise), a >= ``a_min``. A read solves on the first
    read, once ``solve_every`` samples came, or after a sample the last solve
    mispredicted by more than the factor ``surprise`` (a load it has not seen)."""

    __slots__ = ("decay", "dim", "w", "mean", "cov", "a", "coef", "_good", "_pending",
                 "solve_every", "surprise", "a_min", "version")

    def __init__(self, dim: int, decay: float, solve_every: int = 1, surprise: float = 0.0,
                 a_min: float = 0.0) -> None:
        self.decay, self.dim = decay, dim
        self.solve_every, self.surprise, self.a_min = solve_every, surprise, a_min
        self.w = 0.0
        self.mean = [0.0] * (dim + 1)  # regressors, then y
        self.cov = [[0.0] * (dim + 1) for _ in range(dim + 1)]
        self.a: float | None = None  # None before the first solve
        self.coef = [0.0] * dim
        self._good: list[float | None] = [None] * dim
        self._pending = 0
        self.version = 0  # solves so far (a cache key for readers)

    def add(self, y: float, *x: float) -> None:
        f = self.decay
        self.w = f * self.w + 1.0
        v = (*x, y)
        d = [v[i] - self.mean[i] for i in range(self.dim + 1)]
        for i in range(self.dim + 1):
            self.mean[i] += d[i] / self.w
        r = [v[i] - self.mean[i] for i in range(self.dim + 1)]
        for i in range(self.dim + 1):
            row = self.cov[i]
            for j in range(i, self.dim + 1):
                row[j] = f * row[j] + d[i] * r[j]
        self._pending += 1
        if self.a is not None and self.surprise and self._pending < self.solve_every:
            pred = self._predict(x)
            if not pred / self.surprise <= y <= pred * self.surprise:
                self._pending = self.solve_every  # the next read solves

    def predict(self, *x: float) -> float | None:
        """ŷ at ``x``; None before any sample."""
        self.fresh()
        return None if self.a is None else self._predict(x)

    def slope(self, i: int) -> float:
        self.fresh()
        return self.coef[i]

    def identified(self, i: int) -> bool:
        """Slope ``i`` was identified by data at least once."""
        self.fresh()
        return self._good[i] is not None

    def fresh(self) -> None:
        if self._pending and (self.a is None or self._pending >= self.solve_every):
            self._solve()

    def _predict(self, x) -> float:
        return self.a + sum(c * v for c, v in zip(self.coef, x))

    def _c(self, i: int, j: int) -> float:
        return self.cov[i][j] if i <= j else self.cov[j][i]

    def _solve(self) -> None:
        y = self.dim
        ident: list[int] = []
        for i in range(self.dim):
            if self.cov[i][i] / self.w > MIN_VAR and (not ident or _rel_det(self._c, ident + [i]) > MIN_DET):
                ident.append(i)
        held = [(j, max(self._good[j] or 0.0, 0.0)) for j in range(self.dim) if j not in ident]
        rhs = {i: self._c(i, y) - sum(v * self._c(i, j) for j, v in held) for i in ident}
        for i, v in zip(ident, self._nonneg(ident, rhs)):
            self._good[i] = v
        self.coef = [max(g or 0.0, 0.0) for g in self._good]
        self.a = max(self.mean[y] - sum(c * m for c, m in zip(self.coef, self.mean)), self.a_min)
        self._pending = 0
        self.version += 1

    def _nonneg(self, ident: list[int], rhs: dict[int, float]) -> list[float]:
        """Slopes over ``ident``, all >= 0: the full solution if it is, else the
        non-negative subset solution explaining most variance, the rest 0."""
        full = _solve(self._c, ident, rhs)
        if all(v >= 0 for v in full):
            return full
        best, gain = [0.0] * len(ident), 0.0
        for size in range(len(ident) - 1, 0, -1):
            for sub in itertools.combinations(ident, size):
                sol = _solve(self._c, list(sub), rhs)
                g = sum(v * rhs[i] for i, v in zip(sub, sol))
                if all(v >= 0 for v in sol) and g > gain:
                    gain, best = g, [sol[sub.index(i)] if i in sub else 0.0 for i in ident]
        return best


def _solve(c, idx: list[int], rhs: dict[int, float]) -> list[float]:
    """Σ_j c(i, j)·x_j = rhs[i] over ``idx``, by Gaussian elimination (idx identifiable)."""
    m = [[c(i, j) for j in idx] + [rhs[i]] for i in idx]
    n = len(idx)
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _rel_det(c, idx: list[int]) -> float:
    """det / Π variances of the regressors ``idx``: 1 uncorrelated, 0 collinear."""
    m = [[c(i, j) for j in idx] for i in idx]
    det, n = 1.0, len(idx)
    for col in range(n):  # the determinant by elimination
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if m[piv][col] == 0.0:
            return 0.0
        if piv != col:
            m[col], m[piv] = m[piv], m[col]
            det = -det
        det *= m[col][col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n):
                m[r][k] -= f * m[col][k]
    prod = 1.0
    for i in idx:
        prod *= c(i, i)
    return det / prod


class Backoff:
    """``tick``: True once every ``interval`` calls; ``failed`` doubles the interval up to
    ``most``, ``succeeded`` resets it to ``first``."""

    __slots__ = ("first", "most", "interval", "count")

    def __init__(self, first: int, most: int) -> None:
        if not 1 <= first <= most:
            raise ValueError(f"need 1 <= first <= most, got {first!r}, {most!r}")
        self.first, self.most, self.interval, self.count = first, most, first, 0

    def tick(self) -> bool:
        self.count += 1
        if self.count < self.interval:
            return False
        self.count = 0
        return True

    def failed(self) -> None:
        self.interval = min(2 * self.interval, self.most)

    def succeeded(self) -> None:
        self.interval, self.count = self.first, min(self.count, self.first - 1)
