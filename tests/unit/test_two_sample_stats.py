"""The two-sample test of the end-to-end sampled-distribution tests: calibrated under
the null, and able to detect a TV shift of 0.05 (on the coarsened outcome space it
tests) at the sample size and confidence the engine tests use."""

import random

import pytest

from specdec_testing.two_sample import total_variation, two_sample_chi2

N = 8000                 # per arm, as in tests/engine/test_sampled_distribution.py
ALPHA = 1e-3 / 3         # 99.9% overall, Bonferroni over the 3 statistics per config


def _dist(rng, cells):
    w = [rng.random() ** 3 for _ in range(cells)]    # skewed, like LM outputs
    s = sum(w)
    return [x / s for x in w]


def _diffuse_shift(p, tv):
    """Move tv of mass proportionally from the likeliest third to the rest."""
    q = list(p)
    order = sorted(range(len(p)), key=lambda i: -p[i])
    give, take = order[: len(p) // 3], order[len(p) // 3:]
    gsum, tsum = sum(p[i] for i in give), sum(p[i] for i in take)
    for i in give:
        q[i] -= tv * p[i] / gsum
    for i in take:
        q[i] += tv * p[i] / tsum
    return q


def _concentrated_shift(p, tv, rng):
    """Move tv of mass from the likeliest outcome to one of the next five."""
    q = list(p)
    order = sorted(range(len(p)), key=lambda i: -p[i])
    i, j = order[0], order[1 + rng.randrange(5)]
    q[i] -= tv
    q[j] += tv
    return q


def _draw(rng, p, n):
    return rng.choices(range(len(p)), weights=p, k=n)


def test_null_is_calibrated():
    rng = random.Random(0)
    rejections = 0
    for _ in range(200):
        p = _dist(rng, 300)
        rejections += two_sample_chi2(_draw(rng, p, N // 4), _draw(rng, p, N // 4))[2] < 0.01
    assert rejections <= 8            # ~1% expected at level 0.01; 8/200 has p < 0.001


@pytest.mark.parametrize("shift", ["diffuse", "concentrated"])
def test_detects_tv_shift_of_0_05(shift):
    rng = random.Random(1)
    hits = 0
    for _ in range(30):
        p = _dist(rng, 31)            # the 30 top cells + rest, as tested
        q = _diffuse_shift(p, 0.05) if shift == "diffuse" else _concentrated_shift(p, 0.05, rng)
        hits += two_sample_chi2(_draw(rng, p, N), _draw(rng, q, N))[2] < ALPHA
    assert hits >= 27, f"power {hits}/30 at TV=0.05 ({shift}), N={N}"


def test_total_variation():
    assert total_variation([1, 1, 2, 2], [1, 1, 1, 1]) == pytest.approx(0.5)
