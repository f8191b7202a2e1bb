"""The step cost (``control.cost``): the target fit T = a + b·n + p·m + q·R over
decode/verify tokens, prefill tokens and decoding rows, σ, the draft and catch-up fits,
the prices in plain steps and the catch-up room; the step timer (``step_record``); and
which modules stay free of vLLM and torch.

Tolerances come from the noise put in, not tuned to the seeds: with 1 % noise on
T and ~100 effective samples (forgetting 0.99), the slopes' relative standard error
is a few per cent, so the checks allow 10-15 %.
"""

from __future__ import annotations

import ast
import importlib
import logging
import random
import statistics
from types import SimpleNamespace

import pytest

from vllm_specdec_plugin.control.cost import StepCost
from vllm_specdec_plugin.request_state import RequestState
from vllm_specdec_plugin.step_record import StepRecorder, split_tokens
from vllm_specdec_plugin.tuning import (A_MIN, C_PRIME_DRAFT, CREDIT_MAX,
                                        STEP_FIT_SOLVE_EVERY, STEP_FIT_SURPRISE)

pytestmark = pytest.mark.unit


def plain(cost: StepCost, t: float, n: int, m: int = 0) -> None:
    """A step without drafts: one token a decoding row."""
    cost.observe_step(t, n, m, n)


def feed_linear(cost: StepCost, a: float, b: float, ns=(4, 8, 16, 40, 100, 257)) -> None:
    for _ in range(5):
        for n in ns:
            plain(cost, a + b * n, n)


# -- decode-only steps -------------------------------------------------------------------

def test_linear_fit_recovers_a_and_b():
    for a, b in ((0.013, 3.7e-5), (0.002, 4e-4), (0.5, 1e-7)):
        cost = StepCost()
        feed_linear(cost, a, b)
        snap = cost.snapshot()
        assert snap["a"] == pytest.approx(a, rel=0.01)
        assert snap["b"] == pytest.approx(b, rel=0.01)
        assert cost.prices(50).verify == pytest.approx(b / (a + b * 50), rel=0.01)
        assert cost.prices(50).plain_s == pytest.approx(a + b * 50, rel=1e-6)


def test_degenerate_fits():
    cost = StepCost()
    assert cost.snapshot()["a"] is None and cost.step_s(4) is None
    p = cost.prices(8)  # before any step: only a draft position is priced
    assert (p.plain_s, p.verify, p.sigma, p.catch_up, p.prefill) == (0.0,) * 5
    assert p.draft_token == pytest.approx(C_PRIME_DRAFT / 8)
    assert cost.catch_up_room(8, 1.0) is None
    for _ in range(10):  # one distinct n: slope unknown -> flat, v = 0
        plain(cost, 0.02, 32)
    assert cost.snapshot()["b"] == 0.0
    assert cost.snapshot()["a"] == pytest.approx(0.02)
    assert cost.prices(256).verify == 0.0
    neg = StepCost()
    for n in (4, 8, 16, 32) * 5:  # slower with fewer tokens: noise, clamp b to 0
        plain(neg, 0.05 - 0.001 * n, n)
    assert neg.snapshot()["b"] == 0.0
    assert neg.snapshot()["a"] == pytest.approx(0.05 - 0.001 * 15, rel=0.05)
    origin = StepCost()
    for n in (4, 8, 16, 32) * 5:  # negative intercept: a floored at a small positive
        plain(origin, max(1e-3 * n - 0.01, 0.0), n)
    assert origin.snapshot()["a"] == A_MIN
    assert 0 <= origin.prices(64).verify < 1


def test_bad_steps_raise():
    for args in ((0.01, 0, 0, 0), (0.01, 4, -1, 4), (0.01, 4, 0, 5), (-1.0, 4, 0, 4),
                 (float("nan"), 4, 0, 4)):
        with pytest.raises(ValueError, match="bad step"):
            StepCost().observe_step(*args)
    with pytest.raises(ValueError, match="bad draft round"):
        StepCost().observe_draft(0.01, 4, 3)  # fewer tokens than forwards
    with pytest.raises(ValueError, match="catch-up"):
        StepCost().observe_catch_up(0.01, 0)


# -- the draft -----------------------------------------------------------------------------

def test_a_draft_position_is_priced_by_the_draft_fit_in_plain_steps():
    """A draft round of P forwards over N tokens: d0 + d1·P + d2·N. A position of one
    row is a forward over B rows' share: (d0 + d1 + d2·B) / (B·T(B)); a catch-up
    feeding a prompt adds tokens, not forwards, and does not read as dearer drafting."""
    a, b = 0.02, 2e-5  # target step: T(n) = a + b·n
    a_d, b_d = 2e-3, 2e-5  # draft: a forward's fixed cost, and per token
    cost = StepCost()
    feed_linear(cost, a, b)
    assert cost.prices(8).draft_token == pytest.approx(C_PRIME_DRAFT / 8)  # unmeasured
    cost.observe_draft(0.01, 0, 0)  # a round without drafting passes: nothing
    assert cost.prices(8).draft_token == pytest.approx(C_PRIME_DRAFT / 8)
    rng = random.Random(3)
    naive = []
    for _ in range(60):
        rows, k = rng.randint(1, 16), rng.randint(1, 8)
        fed = rows * rng.choice([1, 2, 2, 40, 300])  # steady, or a catch-up
        tokens = fed + rows * (k - 1)
        seconds = (k * a_d + tokens * b_d) * (1 + rng.uniform(-0.02, 0.02))
        cost.observe_draft(seconds, k, tokens)
        naive.append(seconds / k / (a + b * rows))  # seconds per forward / a plain step
    for batch in (1, 8, 16):
        want = (a_d + b_d * batch) / (batch * (a + b * batch))
        assert cost.prices(batch).draft_token == pytest.approx(want, rel=0.1)
    assert statistics.fmean(naive) > 2 * 16 * cost.prices(16).draft_token
    assert cost.snapshot()["draft_b"] == pytest.approx(b_d, rel=0.15)


# -- steps with prefill -------------------------------------------------------------------

def _serving_steps(rng: random.Random, steps: int):
    """(n decode tokens, m prefill tokens) as a server sees them: every step decodes,
    about one in four also runs a prompt chunk."""
    for _ in range(steps):
        n = rng.randint(1, 64) * rng.choice((1, 2, 5))
        m = rng.choice((0, 0, 0, rng.randint(16, 512)))
        yield n, m


@pytest.mark.parametrize("a,b,p", [(0.013, 3.7e-5, 1.2e-5), (0.002, 4e-4, 9e-5),
                                   (0.05, 1e-5, 4e-5)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_a_b_p_from_noisy_steps(a, b, p, seed):
    rng = random.Random(seed)
    cost = StepCost()
    for n, m in _serving_steps(rng, 1500):
        plain(cost, (a + b * n + p * m) * (1 + rng.gauss(0, 0.01)), n, m)
    snap = cost.snapshot()
    assert snap["a"] == pytest.approx(a, rel=0.15)
    assert snap["b"] == pytest.approx(b, rel=0.15)
    assert snap["p"] == pytest.approx(p, rel=0.15)
    assert cost.step_s(50) == pytest.approx(a + b * 50, rel=0.1)
    assert cost.step_s(50, 200) == pytest.approx(a + b * 50 + p * 200, rel=0.1)
    assert cost.prices(50).prefill == pytest.approx(p / (a + b * 50), rel=0.15)


def _one_regressor(samples, decay=0.99):
    """The fit of decode steps alone, written out (reference for bitwise equality)."""
    w = mn = mt = cnn = cnt = 0.0
    for t, n in samples:
        w = decay * w + 1.0
        dn, dt = n - mn, t - mt
        mn += dn / w
        mt += dt / w
        cnn = decay * cnn + dn * (n - mn)
        cnt = decay * cnt + dn * (t - mt)
    b = max(cnt / cnn, 0.0)
    return max(mt - b * mn, A_MIN), b


def test_without_prefill_or_drafts_the_fit_is_the_one_regressor_fit():
    """Prefill steps do not bias the decode fit: without them the three-regressor fit
    is the one-regressor least squares, m and R unidentified (R = n)."""
    rng = random.Random(11)
    samples = [(0.01 + 2e-5 * n + rng.gauss(0, 1e-4), n)
               for n in (rng.randint(1, 300) for _ in range(500))]
    cost = StepCost()
    for t, n in samples:
        plain(cost, t, n)
    snap = cost.snapshot()
    a, b = _one_regressor(samples)
    assert (snap["a"], snap["b"]) == (a, b)  # bit for bit
    assert snap["p"] == snap["q"] == 0.0
    mixed = StepCost()
    for n, m in _serving_steps(random.Random(5), 1000):
        plain(mixed, 0.01 + 1e-4 * n + 5e-5 * m, n, m)
    assert mixed.step_s(32) == pytest.approx(0.01 + 1e-4 * 32, rel=1e-6)
    assert mixed.snapshot()["p"] == pytest.approx(5e-5, rel=1e-6)


def test_degenerate_prefill_fits():
    a, b, p = 0.01, 1e-4, 5e-5
    # every step carries the same prefill: p is not identifiable, stays 0; b is fit
    same = StepCost()
    for n in (4, 8, 16, 32) * 10:
        plain(same, a + b * n + p * 64, n, 64)
    assert same.snapshot()["p"] == 0.0
    assert same.snapshot()["b"] == pytest.approx(b, rel=1e-6)
    # prefill moves in lockstep with n: the two cannot be told apart, no blow-up
    lock = StepCost()
    for n in (4, 8, 16, 32) * 10:
        plain(lock, a + b * n + p * 2 * n, n, 2 * n)
    assert lock.snapshot()["b"] >= 0 and lock.snapshot()["p"] >= 0
    assert lock.step_s(8, 16) == pytest.approx(a + b * 8 + p * 16, rel=1e-6)
    # prefill-only steps (no row decoding)
    only = StepCost()
    for m in (16, 64, 256, 512) * 10:
        only.observe_step(a + p * m, 0, m, 0)
    assert only.snapshot()["p"] == pytest.approx(p, rel=1e-6)
    assert only.snapshot()["b"] == 0.0 and only.step_s(0) == pytest.approx(a)
    # slower with more prefill is the truth; faster is noise: p clamped to 0
    neg = StepCost()
    rng = random.Random(2)
    for _ in range(200):
        n, m = rng.randint(1, 64), rng.choice((0, 128, 256))
        plain(neg, max(a + b * n - 1e-5 * m, 0.0), n, m)
    assert neg.snapshot()["p"] == 0.0 and neg.snapshot()["b"] > 0
    # negative intercept: floored at A_MIN
    origin = StepCost()
    for n, m in ((4, 0), (8, 100), (16, 0), (32, 300)) * 5:
        plain(origin, max(1e-3 * n + 1e-4 * m - 0.01, 0.0), n, m)
    assert origin.step_s(0) == A_MIN


# -- rows apart from verify tokens ----------------------------------------------------------

def _verifying_steps(rng: random.Random, steps: int, k_max: int = 8):
    """(n tokens, m prefill tokens, R rows) of a server's steps at a load that moves:
    R rows decoding, each verifying 0..k_max drafts, about one step in four with a
    prompt chunk."""
    for _ in range(steps):
        rows = rng.randint(1, 16)
        n = rows + sum(rng.randint(0, k_max) for _ in range(rows))
        yield n, rng.choice((0, 0, 0, rng.randint(16, 512))), rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_tells_a_row_from_a_verify_token(seed):
    """A row costs b + q, a verify token b: with a row 1.7x a token (the smol target in
    float32 on a CPU measures 1.4-1.7x) the fit recovers both, and the price of a verify
    token is b / T(B)."""
    a, b, q, p = 0.046, 2.6e-3, 1.8e-3, 2.5e-3 / 20
    rng = random.Random(seed)
    cost = StepCost()
    for n, m, rows in _verifying_steps(rng, 1500):
        cost.observe_step((a + b * n + q * rows + p * m) * (1 + rng.gauss(0, 0.01)), n, m, rows)
    snap = cost.snapshot()
    assert snap["a"] == pytest.approx(a, rel=0.15)
    assert snap["b"] == pytest.approx(b, rel=0.15)
    # n moves with R (n ≈ 5R here), so q has the widest error
    assert snap["q"] == pytest.approx(q, rel=0.3)
    assert snap["p"] == pytest.approx(p, rel=0.15)
    assert cost.step_s(8) == pytest.approx(a + (b + q) * 8, rel=0.05)
    assert cost.step_s(40, rows=8) == pytest.approx(a + b * 40 + q * 8, rel=0.05)
    assert cost.prices(8).verify == pytest.approx(b / (a + (b + q) * 8), rel=0.15)


def test_rows_read_as_tokens_overprice_a_draft():
    """The fit without rows (every token a row) takes part of a row's cost for a
    token's: with a row 1.7x a token it prices a draft token at 1.28x what it costs."""
    a, b, q = 0.046, 2.6e-3, 1.8e-3
    rng = random.Random(4)
    with_rows, without = StepCost(), StepCost()
    for n, _, rows in _verifying_steps(rng, 1000):
        t = a + b * n + q * rows
        with_rows.observe_step(t, n, 0, rows)
        without.observe_step(t, n, 0, n)
    true_v = b / (a + (b + q) * 8)
    assert with_rows.prices(8).verify == pytest.approx(true_v, rel=1e-6)
    assert without.prices(8).verify > 1.2 * true_v


def test_rows_in_lockstep_with_tokens_keep_the_token_fit():
    """Every row verifying the same k (n = (1 + k)·R): rows cannot be told from tokens;
    q keeps its last identified value (0 before one) and the step is still predicted."""
    a, b = 0.02, 1e-3
    lock = StepCost()
    for rows in (1, 2, 4, 8, 16) * 10:
        lock.observe_step(a + b * 4 * rows, 4 * rows, 0, rows)
    assert lock.snapshot()["q"] == 0.0
    assert lock.snapshot()["b"] == pytest.approx(b, rel=1e-6)
    assert lock.step_s(32, rows=8) == pytest.approx(a + b * 32, rel=1e-6)
    known = StepCost()
    q = 3e-3
    for n, _, rows in _verifying_steps(random.Random(6), 300):
        known.observe_step(a + b * n + q * rows, n, 0, rows)
    for rows in (1, 2, 4, 8, 16) * 40:
        known.observe_step(a + b * 4 * rows + q * rows, 4 * rows, 0, rows)
    assert known.snapshot()["q"] == pytest.approx(q, rel=1e-3)
    assert known.snapshot()["b"] == pytest.approx(b, rel=1e-3)


# -- when the target fit solves, and the prices it gives ----------------------------------

def test_the_target_fit_solves_every_few_steps_and_the_prices_follow_each_solve():
    """The sums take every step; the solve waits for STEP_FIT_SOLVE_EVERY new steps
    (the first read solves at once); ``prices`` is rebuilt after a solve and only then,
    and never serves a fit whose solve is due."""
    cost = StepCost()
    plain(cost, 0.012, 1)
    first = cost.prices(1)
    assert first.plain_s == pytest.approx(0.012)  # first read: solved
    assert cost.prices(1) is first
    for i in range(STEP_FIT_SOLVE_EVERY - 1):  # 7 more, within 2x of 12 ms: not yet
        n = 2 + i % 3
        plain(cost, 0.010 + 0.002 * n, n)
        assert cost.prices(1) is first
    plain(cost, 0.010 + 0.002 * 2, 2)  # the 8th since the solve
    solved = cost.prices(1)
    assert solved is not first and solved.verify > 0
    assert cost.prices(1) is solved
    assert cost.prices(4) is not solved and cost.prices(4) is cost.prices(4)  # per batch


def test_a_step_the_fit_mispredicts_by_more_than_the_surprise_factor_reprices_at_once():
    """A young fit that has seen one row meets a batch of 8 (a start burst): the first
    such step, 2x off or more, makes the next ``prices`` solve instead of waiting 8."""
    cost = StepCost()
    for n in (1, 2, 3) * 4:
        plain(cost, 0.020 + 0.002 * n, n)
    young = cost.prices(8)
    assert cost.prices(8) is young
    plain(cost, young.plain_s * 1.5, 8)  # off, but within the factor
    assert cost.prices(8) is young
    plain(cost, young.plain_s / (STEP_FIT_SURPRISE * 1.1), 8)
    assert cost.prices(8) is not young


# -- σ ------------------------------------------------------------------------------------

def test_sigma_is_priced_once_measured_and_apart_from_the_forward():
    cost = StepCost()
    for n in (4, 8, 16, 32) * 10:
        plain(cost, 0.01 + 0.001 * n, n)
    assert cost.prices(8).sigma == 0.0 and cost.sigma_s(8) == 0.0  # not measured yet
    # the first verifying step (imports, allocation) is not kept; its seconds still
    # leave the target fit
    cost.observe_step(0.01 + 0.001 * 12 + 0.5, 12, 0, 8, exact_s=0.5, verified=True)
    assert cost.sigma_s(8) == 0.0
    for _ in range(3):
        cost.observe_step(0.01 + 0.001 * 12 + 0.002, 12, 0, 8, exact_s=0.002, verified=True)
    assert cost.sigma_s(8) == pytest.approx(0.002)
    assert cost.prices(8).sigma == pytest.approx(0.002 / cost.step_s(8))
    assert cost.step_s(12, rows=8) == pytest.approx(0.01 + 0.001 * 12, rel=1e-3)
    # a prefill step's exact sampler also samples first tokens: no σ sample
    cost.observe_step(0.5, 12, 100, 8, exact_s=0.4, verified=True)
    assert cost.sigma_s(8) == pytest.approx(0.002)
    # σ grows with the rows it samples
    rowsy = StepCost()
    plain(rowsy, 0.02, 8)
    for rows in (1, 2, 4, 8) * 6:
        rowsy.observe_step(0.05, 2 * rows, 0, rows, exact_s=0.001 + 2e-4 * rows, verified=True)
    assert rowsy.sigma_s(16) == pytest.approx(0.001 + 2e-4 * 16, rel=1e-6)


# -- catch-up ------------------------------------------------------------------------------

def test_the_catch_up_fit_reads_seconds_per_token_until_the_feed_varies_then_the_slope():
    cost = StepCost()
    assert cost.catch_up_per_token() is None
    cost.observe_catch_up(0.010, 16)  # one size only: the forward's fixed cost read as tokens
    assert cost.catch_up_per_token() == pytest.approx(0.010 / 16)
    for n in (16, 200, 40, 900, 16, 300):  # 4 ms a pass + 0.1 ms a token
        cost.observe_catch_up(0.004 + 1e-4 * n, n)
    assert cost.catch_up_per_token() == pytest.approx(1e-4, rel=0.05)
    assert cost.snapshot()["catch_up_b"] == cost.catch_up_per_token()


def test_a_slope_noise_makes_negative_falls_back_to_the_upper_bound():
    cost = StepCost()
    cost.observe_catch_up(0.02, 10)
    cost.observe_catch_up(0.01, 100)  # more tokens, less time: noise
    mean_s, mean_n = cost.catch_up.mean[1], cost.catch_up.mean[0]
    assert cost.catch_up_per_token() == pytest.approx(mean_s / mean_n)
    assert mean_s / mean_n < 0.02 / 10  # the weighted means, not one pass


def test_a_token_fed_is_priced_in_plain_steps_at_the_batch():
    cost = StepCost()
    for n in (4, 8, 16, 32) * 10:
        plain(cost, 0.02 + 0.002 * n, n)
    assert cost.prices(16).catch_up == 0.0  # no catch-up pass and no prefill step yet
    for n in (16, 200, 40, 900):
        cost.observe_catch_up(0.004 + 1e-4 * n, n)
    assert cost.prices(16).catch_up == pytest.approx(1e-4 / cost.step_s(16), rel=0.05)
    # before a pass, the target's prompt token stands in (the draft is the smaller model)
    young = StepCost()
    for n, m in ((8, 0), (1, 300), (16, 0), (1, 900)) * 5:
        plain(young, 0.02 + 0.002 * n + 0.001 * m, n, m)
    assert young.prices(8).catch_up == pytest.approx(0.001 / young.step_s(8), rel=1e-6)


def test_a_round_may_feed_what_delays_a_step_by_most_plain_steps_where_other_rows_wait():
    """T(B) = 20 ms + 2 ms a token, c1 = 0.1 ms: at B = 8 a round may feed (most = 1
    plain step) 36 ms / 0.1 ms = 360 tokens, 2x that at most = 2; never fewer than one a
    row; a lone row and an unmeasured fit are not bounded."""
    cost = StepCost()
    assert cost.catch_up_room(8, 1.0) is None  # nothing measured
    for n in (4, 8, 16, 32) * 10:
        plain(cost, 0.02 + 0.002 * n, n)
    assert cost.catch_up_room(8, 1.0) is None  # no catch-up pass yet, no prefill step seen
    young = StepCost()
    for n, m in ((8, 0), (1, 300), (16, 0), (1, 900)) * 5:
        plain(young, 0.02 + 0.002 * n + 0.001 * m, n, m)
    room = young.step_s(8) / young.snapshot()["p"]  # p stands in for c1
    assert young.catch_up_room(8, 1.0) == int(room) and 35 < room < 37
    for n in (16, 200, 40, 900):
        cost.observe_catch_up(0.004 + 1e-4 * n, n)
    room = cost.step_s(8) / cost.catch_up_per_token()
    assert cost.catch_up_room(8, 1.0) == int(room) and 340 < room < 380
    assert cost.catch_up_room(8, 2.0) == int(2 * room)
    assert cost.catch_up_room(1, 1.0) is None  # only its own catch-up delays a lone row
    slow = StepCost()
    plain(slow, 0.01, 4)
    slow.observe_catch_up(1.0, 10)  # 0.1 s a token: the room would round to 0
    assert slow.catch_up_room(4, 1.0) == 4
    assert slow.catch_up_room(4, 0.0) == 4


# -- the step timer ------------------------------------------------------------------------

def test_split_tokens_counts_decode_verify_and_prefill():
    seen = lambda drafted: SimpleNamespace(seen=True, drafted=drafted)  # noqa: E731
    requests = {"a": seen([5, 6]), "b": seen([]), "c": SimpleNamespace(seen=False, drafted=[])}
    # a verifies 2 drafts, b decodes, c ran its prompt's last chunk, d is mid-prompt
    sampled = [[1, 2], [3], [4], []]
    ids = ["a", "b", "c", "d"]
    scheduled = {"a": 3, "b": 1, "c": 40, "d": 128}
    assert split_tokens(sampled, ids, requests, scheduled) == (3 + 1, 40 + 128, 2, True)
    # without scheduled counts a step with prefill is unknown, a decode step is not
    assert split_tokens(sampled, ids, requests, None) is None
    assert split_tokens(sampled[:2], ids[:2], requests, None) == (4, 0, 2, True)
    # a decode row given more than 1 + its drafts: the rest is prefill
    assert split_tokens([[3]], ["b"], requests, {"b": 9}) == (1, 8, 1, False)


def _recorder(cost: StepCost, tpot_limit: float = 1.05) -> StepRecorder:
    return StepRecorder(cost, SimpleNamespace(target_step=lambda *a: None), tpot_limit)


def _four_rows():
    requests = {r: RequestState(seen=True) for r in "abcd"}
    requests["a"].drafted = [7, 8]
    return requests


def test_the_step_timer_feeds_the_fit_and_settles_each_decoding_rows_budget(monkeypatch):
    from vllm_specdec_plugin import step_record

    clock = [100.0]
    monkeypatch.setattr(step_record, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    cost = StepCost()
    for b in (2, 4, 8):
        plain(cost, 0.010 + 0.002 * b, b)
    rec = _recorder(cost)
    requests = _four_rows()
    assert rec.end([[1]], ["a"], requests, 0.0) is None  # never begun
    rec.begin(None)
    clock[0] += 0.010 + 0.002 * 6  # 6 tokens over 4 rows, as the fit has it
    saved = rec.end([[1, 2, 3], [1], [1], [1]], list("abcd"), requests, 0.0)
    assert cost.target.w > 3  # observed
    # F: the step as the fit predicts it, over a plain step at 4 rows
    f = cost.step_s(6, rows=4) / cost.step_s(4)
    assert f == pytest.approx(0.022 / 0.018)
    assert saved == pytest.approx(0.018 * (6 / 4 - f))
    assert 1.05 * 3 - f > CREDIT_MAX and requests["a"].credit == CREDIT_MAX  # clipped
    assert requests["b"].credit == pytest.approx(1.05 - f) and requests["b"].credit < 0
    # a step with a prefill row books no budget and no saving
    rec.begin({"a": 1, "e": 50})
    clock[0] += 0.05
    before = requests["a"].credit
    assert rec.end([[1], [9]], ["a", "e"], {"a": requests["a"]}, 0.0) is None
    assert requests["a"].credit == before


def test_step_log_line_carries_the_prediction_made_before_the_step(caplog):
    """With ``vllm.specdec_plugin.steps`` at DEBUG, each recorded step logs its timers and
    the fit's prediction from before it saw the step, in the form benchmarks/step_log.py
    parses; nothing is logged at INFO."""
    from benchmarks import step_log
    cost = StepCost()
    for b in (2, 4, 8):
        plain(cost, 0.010 + 0.002 * b, b)
    rec = _recorder(cost, 1.2)
    for level in (logging.INFO, logging.DEBUG):
        caplog.clear()
        requests = _four_rows()
        before = cost.step_s(6, rows=4)
        with caplog.at_level(level, logger="vllm.specdec_plugin.steps"):
            rec.begin(None)
            rec.end([[1, 2, 3], [1], [1], [1]], list("abcd"), requests, 0.0)
        lines = [r.getMessage() for r in caplog.records if "specdec step:" in r.getMessage()]
        assert len(lines) == (level == logging.DEBUG)
    (step,) = step_log.parse(lines)
    assert [step[k] for k in ("n", "m", "rows", "verify", "emitted")] == [6, 0, 4, True, 6]
    assert step["pred"] == pytest.approx(1e3 * before, abs=0.01)
    cost.target._solve()  # the fit re-solves every few steps: now, to see this one
    assert before != pytest.approx(cost.step_s(6, rows=4))  # the step was observed after


# -- modules that must not need vLLM or torch ----------------------------------------

PURE = {  # module -> the package modules it may import (each itself pure)
    "tuning": set(),
    "control": set(),
    "control.estimators": set(),
    "control.cost": {"control.estimators", "tuning"},
    "control.acceptance": {"control.estimators", "tuning"},
    "control.policy": {"control.estimators", "tuning"},
    "step_record": {"control.cost", "tuning"},
    "shadow": {"tuning"},
    "tenancy": {"ngram_corpus"},
    "ngram": {"tuning"},
    "ngram_corpus": {"ngram", "tuning"},
}
STDLIB = {"__future__", "math", "statistics", "collections", "dataclasses", "typing", "time",
          "itertools", "heapq", "logging"}


def imports_of(name: str) -> tuple[set[str], set[str]]:
    """(top-level packages, package modules) that vllm_specdec_plugin.<name> imports."""
    mod = importlib.import_module(f"vllm_specdec_plugin.{name}")
    top, ours = set(), set()
    for node in ast.walk(ast.parse(open(mod.__file__).read())):
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.startswith("vllm_specdec_plugin."):
                ours.add(module.removeprefix("vllm_specdec_plugin."))
            else:
                top.add(module.split(".")[0])
    return top, ours


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_modules_import_no_vllm_or_torch(name):
    top, ours = imports_of(name)
    allowed = STDLIB | ({"numpy"} if name.startswith("ngram") else set())
    assert top <= allowed, (name, top - allowed)
    assert ours <= PURE[name], (name, ours - PURE[name])


def test_sigma_prices_each_sampled_position_a_verification_reaches():
    """σ = s0 + s1·R + s2·P: P, the sampled positions made past each row's first, varies
    with acceptance apart from the rows; s2 / T(B) is the price of one more of them."""
    cost = StepCost()
    plain(cost, 0.03, 1)
    rng = random.Random(3)
    for _ in range(40):
        rows, positions = rng.choice((1, 2, 4)), rng.randint(0, 8)
        cost.observe_step(0.06, 5 * rows, 0, rows, exact_s=0.001 + 2e-4 * rows + 0.0045 * positions,
                          verified=True, positions=positions)
    assert cost.sigma_s(2, 3) == pytest.approx(0.001 + 4e-4 + 0.0135, rel=1e-6)
    assert cost.prices(1).sampled_position == pytest.approx(0.0045 / cost.step_s(1), rel=1e-6)
    greedy = StepCost()   # no sampled row: the term is never identified, so never priced
    plain(greedy, 0.03, 1)
    for rows in (1, 2, 4) * 8:
        greedy.observe_step(0.06, 5 * rows, 0, rows, exact_s=0.001 + 2e-4 * rows, verified=True)
    assert greedy.prices(1).sampled_position == 0.0
