"""The controller's three estimators (``control.estimators``): DecayedRate, OnlineFit,
Backoff. Pure Python; the references here are numpy / scipy.

Statistical tolerances come from the noise put in, not tuned to the seeds: the
acceptance convergence test runs at decay 0.999 for 2000 rounds (~870 effective
rounds; the standard error of α̂ at α = 0.3 is ~0.016, so 0.05 is > 3 sigma).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy.optimize import nnls

from vllm_specdec_plugin.control.acceptance import evidence
from vllm_specdec_plugin.control.estimators import Backoff, DecayedRate, OnlineFit

pytestmark = pytest.mark.unit


def draw_accepted(rng: random.Random, alpha: float, k: int) -> int:
    """Geometric model: each draft accepted with prob. alpha until the first rejection."""
    n = 0
    while n < k and rng.random() < alpha:
        n += 1
    return n


# -- DecayedRate ----------------------------------------------------------------------

def test_decayed_rate_is_the_shrunk_ratio_of_decayed_sums():
    r = DecayedRate(0.5)
    assert r.value(0.6, 4.0) == pytest.approx(0.6)  # no evidence: the prior
    r.add(3, 4)
    r.add(0, 1)  # the first round now weighs 0.5
    assert (r.num, r.den) == (1.5, 3.0)
    assert r.value(0.6, 4.0) == pytest.approx((4 * 0.6 + 1.5) / (4 + 3.0))
    assert r.value(0.6, 0.0) == pytest.approx(0.5)  # no prior weight: the plain ratio
    plain = DecayedRate(1.0)  # decay 1: plain counts
    for num, den in ((1, 2), (3, 3), (0, 5)):
        plain.add(num, den)
    assert (plain.num, plain.den) == (4, 10)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="decay"):
            DecayedRate(bad)


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decayed_acceptance_converges_to_the_geometric_alpha(alpha, seed):
    rng = random.Random(seed)
    rate = DecayedRate(0.999)
    for _ in range(2000):
        k = rng.randint(1, 8)
        rate.add(*evidence(k, draw_accepted(rng, alpha, k)))
    assert abs(rate.value(0.6, 4.0) - alpha) < 0.05


# -- OnlineFit: least squares ------------------------------------------------------------

def _fit(dim: int, decay: float = 1.0, **kw) -> OnlineFit:
    return OnlineFit(dim, decay, **kw)


def test_the_fit_recovers_a_known_linear_model_exactly():
    rng = random.Random(0)
    for a, coef in ((0.013, [3.7e-5]), (0.002, [4e-4, 9e-5]), (0.05, [1e-3, 2e-4, 5e-3])):
        fit = _fit(len(coef), 0.99)
        for _ in range(200):
            x = [rng.uniform(0, 300) for _ in coef]
            fit.add(a + sum(c * v for c, v in zip(coef, x)), *x)
        fit.fresh()
        assert fit.a == pytest.approx(a, rel=1e-6)
        for i, c in enumerate(coef):
            assert fit.slope(i) == pytest.approx(c, rel=1e-6)
            assert fit.identified(i)
        assert fit.predict(*[10.0] * len(coef)) == pytest.approx(a + 10 * sum(coef), rel=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_the_fit_is_exponentially_weighted_least_squares(seed):
    """Against numpy's least squares on the samples weighted decay^age, with noise."""
    rng = np.random.default_rng(seed)
    decay, n = 0.95, 120
    x = rng.uniform(0, 50, size=(n, 3))
    y = 0.5 + x @ np.array([0.2, 0.05, 0.7]) + rng.normal(0, 0.5, size=n)
    fit = _fit(3, decay)
    for row, t in zip(x, y):
        fit.add(float(t), *map(float, row))
    w = np.sqrt(decay ** np.arange(n - 1, -1, -1))
    design = np.column_stack([np.ones(n), x])
    ref, *_ = np.linalg.lstsq(design * w[:, None], y * w, rcond=None)
    assert min(ref[1:]) > 0  # the check is of the unconstrained solution
    fit.fresh()
    assert fit.a == pytest.approx(ref[0], rel=1e-6, abs=1e-9)
    assert [fit.slope(i) for i in range(3)] == pytest.approx(list(ref[1:]), rel=1e-6)


@pytest.mark.parametrize("seed", range(20))
def test_slopes_are_the_non_negative_least_squares_solution(seed):
    """Slopes >= 0 always; where the unconstrained solution has a negative one, the fit
    is the non-negative least-squares solution (scipy's nnls on the centred, weighted
    samples), and the intercept is the weighted mean's."""
    rng = np.random.default_rng(100 + seed)
    decay, n = 0.97, 80
    x = rng.uniform(0, 10, size=(n, 3))
    coef = rng.uniform(-1, 1, size=3)
    y = 2.0 + x @ coef + rng.normal(0, 0.3, size=n)
    fit = _fit(3, decay)
    for row, t in zip(x, y):
        fit.add(float(t), *map(float, row))
    fit.fresh()
    got = [fit.slope(i) for i in range(3)]
    assert all(v >= 0 for v in got)
    w = decay ** np.arange(n - 1, -1, -1)
    mx, my = (w @ x) / w.sum(), (w @ y) / w.sum()
    sw = np.sqrt(w)
    ref, _ = nnls((x - mx) * sw[:, None], (y - my) * sw)
    assert got == pytest.approx(list(ref), abs=1e-7)
    assert fit.a == pytest.approx(max(my - ref @ mx, 0.0), abs=1e-6)


def test_an_unidentifiable_slope_is_held_at_its_last_value():
    # a regressor that never varies: its slope stays 0, the other is fit, a absorbs it
    flat = _fit(2)
    for n in (4, 8, 16, 32) * 5:
        flat.add(0.01 + 1e-3 * n + 5e-5 * 64, n, 64)
    assert not flat.identified(1) and flat.slope(1) == 0.0
    assert flat.slope(0) == pytest.approx(1e-3, rel=1e-9)
    assert flat.predict(8, 64) == pytest.approx(0.01 + 8e-3 + 5e-5 * 64, rel=1e-9)
    # collinear with an earlier one: held at 0 before it was ever told apart ...
    lock = _fit(2, 0.99)
    for n in (1, 2, 4, 8, 16) * 10:
        lock.add(0.02 + 4e-3 * n, 4 * n, n)
    assert lock.identified(0) and not lock.identified(1) and lock.slope(1) == 0.0
    assert lock.slope(0) == pytest.approx(1e-3, rel=1e-6)
    # ... and at its identified value after: back in lockstep nothing moves it
    rng = random.Random(6)
    known = _fit(2, 0.99)
    for _ in range(300):
        rows = rng.randint(1, 16)
        n = rows + sum(rng.randint(0, 8) for _ in range(rows))
        known.add(0.02 + 1e-3 * n + 3e-3 * rows, n, rows)
    for rows in (1, 2, 4, 8, 16) * 40:
        known.add(0.02 + 1e-3 * 4 * rows + 3e-3 * rows, 4 * rows, rows)
    assert known.slope(1) == pytest.approx(3e-3, rel=1e-3)
    assert known.slope(0) == pytest.approx(1e-3, rel=1e-3)


def test_degenerate_one_regressor_fits():
    one = _fit(1)
    assert one.predict(3) is None and one.a is None
    for _ in range(10):  # one distinct x: slope unknown, flat at the mean
        one.add(0.02, 32)
    assert one.slope(0) == 0.0 and one.a == pytest.approx(0.02)
    neg = _fit(1)
    for n in (4, 8, 16, 32) * 5:  # slower with fewer tokens: noise, clamp to 0
        neg.add(0.05 - 0.001 * n, n)
    assert neg.slope(0) == 0.0 and neg.a == pytest.approx(0.05 - 0.001 * 15)
    floor = _fit(1, a_min=1e-6)
    for n in (4, 8, 16, 32) * 5:  # negative intercept: floored
        floor.add(max(1e-3 * n - 0.01, 0.0), n)
    assert floor.slope(0) > 0 and floor.a == 1e-6


# -- OnlineFit: when it solves ---------------------------------------------------------

def test_the_first_read_solves_then_every_solve_every_samples():
    fit = _fit(1, 0.99, solve_every=8, surprise=2.0)
    fit.add(0.012, 1)
    assert fit.predict(1) == pytest.approx(0.012) and fit.version == 1  # first read solves
    for i in range(7):  # 7 more, each within 2x of the prediction: not yet
        n = 2 + i % 3
        fit.add(0.010 + 0.002 * n, n)
        fit.fresh()
        assert fit.version == 1 and fit.slope(0) == 0.0
    fit.add(0.010 + 0.002 * 2, 2)  # the 8th since the solve
    assert fit.slope(0) > 0 and fit.version == 2
    for _ in range(3):  # no new sample: no solve
        fit.fresh()
    assert fit.version == 2


def test_a_sample_mispredicted_by_more_than_the_surprise_factor_solves_at_the_next_read():
    """A young fit that has seen one row meets a batch of 8 (a start burst): the first
    such step, 2x off or more, makes the next read solve instead of waiting 8 steps."""
    fit = _fit(1, 0.99, solve_every=8, surprise=2.0)
    for n in (1, 2, 3) * 4:
        fit.add(0.020 + 0.002 * n, n)
    fit.fresh()
    young = fit.version
    pred = fit.predict(8)
    fit.add(pred * 1.5, 8)  # off, but within the factor
    fit.fresh()
    assert fit.version == young
    fit.add(pred / 2.2, 8)  # 2.2x below the prediction
    assert fit.version == young  # the sums took it; the solve waits for a read
    fit.fresh()
    assert fit.version == young + 1
    # without a surprise factor the same sample waits for the cadence
    calm = _fit(1, 0.99, solve_every=8)
    for n in (1, 2, 3) * 4:
        calm.add(0.020 + 0.002 * n, n)
    calm.fresh()
    v = calm.version
    calm.add(calm.predict(8) / 10, 8)
    calm.fresh()
    assert calm.version == v


# -- Backoff ---------------------------------------------------------------------------

def test_backoff_ticks_every_interval_doubles_on_failure_and_resets_on_success():
    fired = []
    b = Backoff(2, 8)
    for step in range(1, 23):
        if b.tick():
            fired.append(step)
            b.failed()
    assert fired == [2, 6, 14, 22]  # intervals 2, 4, 8, 8 (the ceiling)
    assert b.interval == 8
    for _ in range(5):
        b.tick()
    b.succeeded()  # back to the first interval; at most first - 1 already counted
    assert b.interval == 2 and b.count == 1
    assert b.tick() is True
    with pytest.raises(ValueError):
        Backoff(0, 4)
    with pytest.raises(ValueError):
        Backoff(16, 8)
