"""The step cost model (``step_cost``): the target fit T = a + b·n + p·m + q·R over
decode/verify tokens, prefill tokens and decoding rows, the draft fit, σ; the step
timer's token split (``step_record``); and which modules stay free of vLLM and torch.

Tolerances come from the noise put in, not tuned to the seeds: with 1 % noise on
T and ~100 effective samples (forgetting 0.99), the slopes' relative standard error
is a few per cent, so the checks allow 10-15 %.
"""

from __future__ import annotations

import ast
import importlib
import random
import statistics
from types import SimpleNamespace

import pytest

from vllm_specdec_plugin.adaptive import AdaptiveConfig, AdaptiveK
from vllm_specdec_plugin.step_cost import StepCost
from vllm_specdec_plugin.step_record import split_tokens
from vllm_specdec_plugin.tuning import A_MIN

pytestmark = pytest.mark.unit


def feed_linear(ak: AdaptiveK, a: float, b: float, ns=(4, 8, 16, 40, 100, 257)) -> None:
    for _ in range(5):
        for n in ns:
            ak.cost.observe_target_step(a + b * n, n)


# -- decode-only steps (the one-regressor fit) ------------------------------------------

def test_linear_fit_recovers_a_and_b():
    for a, b in ((0.013, 3.7e-5), (0.002, 4e-4), (0.5, 1e-7)):
        ak = AdaptiveK(AdaptiveConfig(k_max=4))
        feed_linear(ak, a, b)
        snap = ak.snapshot()
        assert snap["a"] == pytest.approx(a, rel=0.01)
        assert snap["b"] == pytest.approx(b, rel=0.01)
        assert ak.cost.load_cost(50) == pytest.approx(b * 50 / (a + b * 50), rel=0.01)


def test_degenerate_fits():
    ak = AdaptiveK(AdaptiveConfig(k_max=4))
    assert ak.snapshot()["a"] is None and ak.cost.load_cost(256) == 0.0
    for _ in range(10):  # one distinct n: slope unknown -> flat, v = 0
        ak.cost.observe_target_step(0.02, 32)
    assert ak.snapshot()["b"] == 0.0
    assert ak.snapshot()["a"] == pytest.approx(0.02)
    assert ak.cost.load_cost(256) == 0.0
    neg = AdaptiveK(AdaptiveConfig(k_max=4))
    for n in (4, 8, 16, 32) * 5:  # slower with fewer tokens: noise, clamp b to 0
        neg.cost.observe_target_step(0.05 - 0.001 * n, n)
    assert neg.snapshot()["b"] == 0.0
    assert neg.snapshot()["a"] == pytest.approx(0.05 - 0.001 * 15, rel=0.05)
    origin = AdaptiveK(AdaptiveConfig(k_max=4))
    for n in (4, 8, 16, 32) * 5:  # negative intercept: a floored at a small positive
        origin.cost.observe_target_step(max(1e-3 * n - 0.01, 0.0), n)
    assert 0 < origin.snapshot()["a"] <= 1e-5
    assert 0 <= origin.cost.load_cost(64) < 1


def test_draft_cost_is_measured_relative_to_target_step():
    ak = AdaptiveK(AdaptiveConfig(k_max=4, c_prime_default=0.05))
    ak.cost.observe_draft_step(0.01, 4, 32)  # no target fit yet: nothing to divide by
    assert ak.c_prime(8) == 0.05
    a, b = 0.02, 2e-5
    feed_linear(ak, a, b)
    for _ in range(30):  # 3 forwards over 8 rows, each 0.25 of a target step at B = 8
        ak.cost.observe_draft_step(3 * 0.25 * (a + b * 8), 3, 3 * 8)
    assert ak.c_prime(8) == pytest.approx(0.25, rel=0.01)
    assert ak.cost_per_draft(8) == pytest.approx(0.25 + b * 8 / (a + b * 8), rel=0.01)
    assert ak.snapshot()["c_prime"] == ak.c_prime(1)
    with pytest.raises(ValueError):
        ak.cost.observe_draft_step(0.01, 4, 3)  # fewer tokens than forwards


def test_a_catch_up_prefill_does_not_read_as_dearer_drafting():
    """Rounds that feed a prompt or a held request's backlog to the draft add tokens,
    not forwards: c'(B) stays the cost of one more forward over B rows."""
    a, b = 0.02, 2e-5  # target step: T(n) = a + b·n
    a_d, b_d = 2e-3, 2e-5  # draft: a forward's fixed cost, and per token
    ak = AdaptiveK(AdaptiveConfig(k_max=8))
    feed_linear(ak, a, b)
    rng = random.Random(3)
    naive = []
    for _ in range(60):
        rows, k = rng.randint(1, 16), rng.randint(1, 8)
        fed = rows * rng.choice([1, 2, 2, 40, 300])  # steady, or a catch-up
        tokens = fed + rows * (k - 1)
        seconds = (k * a_d + tokens * b_d) * (1 + rng.uniform(-0.02, 0.02))
        ak.cost.observe_draft_step(seconds, k, tokens)
        naive.append(seconds / k / (a + b * rows))  # the old ratio, per forward
    for batch in (1, 8, 16):
        assert ak.c_prime(batch) == pytest.approx((a_d + b_d * batch) / (a + b * batch), rel=0.1)
    assert statistics.fmean(naive) > 2 * ak.c_prime(16)  # what catch-ups did to the old EMA
    snap = ak.snapshot()
    assert snap["draft_a"] == pytest.approx(a_d, rel=0.15)
    assert snap["draft_b"] == pytest.approx(b_d, rel=0.15)


# -- steps with prefill (the two-regressor fit) -----------------------------------------

def _serving_steps(rng: random.Random, steps: int):
    """(n decode/verify tokens, m prefill tokens) as a server sees them: every step
    decodes, about one in four also runs a prompt chunk."""
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
    for n, m in _serving_steps(rng, 3000):
        cost.observe_target_step((a + b * n + p * m) * (1 + rng.gauss(0, 0.01)), n, m)
    assert cost.step_time(0) == pytest.approx(a, rel=0.15)
    assert cost.price().per_token_s == pytest.approx(b, rel=0.15)
    assert cost.price().per_prefill_token_s == pytest.approx(p, rel=0.15)
    # the controller's view is a step without prefill
    assert cost.step_time(50) == pytest.approx(a + b * 50, rel=0.1)
    assert cost.step_time(50, 200) == pytest.approx(a + b * 50 + p * 200, rel=0.1)
    assert cost.load_cost(50) == pytest.approx(b * 50 / (a + b * 50), rel=0.15)


def test_prefill_steps_no_longer_bias_the_decode_fit():
    """Mixing prefill steps into a one-regressor fit would inflate a and b; the
    two-regressor fit keeps the decode step's cost."""
    a, b, p = 0.01, 1e-4, 5e-5
    rng = random.Random(5)
    cost = StepCost()
    for n, m in _serving_steps(rng, 2000):
        cost.observe_target_step(a + b * n + p * m, n, m)
    assert cost.step_time(32) == pytest.approx(a + b * 32, rel=1e-6)
    assert cost.price().per_prefill_token_s == pytest.approx(p, rel=1e-6)


def _one_regressor(samples, decay=0.99):
    """The fit before prefill steps were recorded (reference for bitwise equality)."""
    w = mn = mt = cnn = cnt = 0.0
    b_good = None
    for t, n in samples:
        w = decay * w + 1.0
        dn, dt = n - mn, t - mt
        mn += dn / w
        mt += dt / w
        cnn = decay * cnn + dn * (n - mn)
        cnt = decay * cnt + dn * (t - mt)
        if cnn / w > 1e-6:
            b_good = cnt / cnn
        b = max(b_good or 0.0, 0.0)
        a = max(mt - b * mn, A_MIN)
    return a, b


def test_without_prefill_the_fit_is_the_one_regressor_fit_exactly():
    rng = random.Random(11)
    samples = [(0.01 + 2e-5 * n + rng.gauss(0, 1e-4), n)
               for n in (rng.randint(1, 300) for _ in range(500))]
    cost = StepCost()
    for t, n in samples:
        cost.observe_target_step(t, n)
    assert (cost.target.a, cost.target.b) == _one_regressor(samples)
    assert cost.price().per_prefill_token_s == 0.0


def test_degenerate_prefill_fits():
    a, b, p = 0.01, 1e-4, 5e-5
    # every step carries the same prefill: p is not identifiable, stays 0; b is fit
    same = StepCost()
    for n in (4, 8, 16, 32) * 10:
        same.observe_target_step(a + b * n + p * 64, n, 64)
    assert same.price().per_prefill_token_s == 0.0
    assert same.price().per_token_s == pytest.approx(b, rel=1e-6)
    # prefill moves in lockstep with n: the two cannot be told apart, no blow-up
    lock = StepCost()
    for n in (4, 8, 16, 32) * 10:
        lock.observe_target_step(a + b * n + p * 2 * n, n, 2 * n)
    assert lock.price().per_token_s >= 0 and lock.price().per_prefill_token_s >= 0
    assert lock.step_time(8, 16) == pytest.approx(a + b * 8 + p * 16, rel=1e-6)
    # prefill-only steps (no row decoding) with a fixed decode count elsewhere
    only = StepCost()
    for m in (16, 64, 256, 512) * 10:
        only.observe_target_step(a + p * m, 0, m)
    assert only.price().per_prefill_token_s == pytest.approx(p, rel=1e-6)
    assert only.price().per_token_s == 0.0 and only.step_time(0) == pytest.approx(a)
    # slower with more prefill is the truth; faster is noise: p clamped to 0
    neg = StepCost()
    rng = random.Random(2)
    for _ in range(200):
        n, m = rng.randint(1, 64), rng.choice((0, 128, 256))
        neg.observe_target_step(max(a + b * n - 1e-5 * m, 0.0), n, m)
    assert neg.price().per_prefill_token_s == 0.0 and neg.price().per_token_s > 0
    # negative intercept: floored at A_MIN
    origin = StepCost()
    for n, m in ((4, 0), (8, 100), (16, 0), (32, 300)) * 5:
        origin.observe_target_step(max(1e-3 * n + 1e-4 * m - 0.01, 0.0), n, m)
    assert origin.step_time(0) == A_MIN
    with pytest.raises(ValueError):
        StepCost().observe_target_step(0.01, 0, 0)  # a step with no tokens
    with pytest.raises(ValueError):
        StepCost().observe_target_step(0.01, 4, -1)
    assert StepCost().step_time(4) is None and StepCost().price() is None


# -- rows apart from verify tokens (the three-regressor fit) ------------------------------

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
    float32 on a CPU measures 1.4-1.7x) the fit recovers both, and v(B) prices a draft
    token at b."""
    a, b, q, p = 0.046, 2.6e-3, 1.8e-3, 2.5e-3 / 20
    rng = random.Random(seed)
    cost = StepCost()
    for n, m, rows in _verifying_steps(rng, 3000):
        cost.observe_target_step((a + b * n + q * rows + p * m) * (1 + rng.gauss(0, 0.01)),
                                 n, m, rows)
    assert cost.step_time(0) == pytest.approx(a, rel=0.15)
    assert cost.price().per_token_s == pytest.approx(b, rel=0.15)
    # n moves with R (n ≈ 5R here), so q has the widest error: ~7 % sd over 12 seeds
    assert cost.price().per_row_s == pytest.approx(q, rel=0.3)
    assert cost.price().per_prefill_token_s == pytest.approx(p, rel=0.15)
    assert cost.step_time(8) == pytest.approx(a + (b + q) * 8, rel=0.05)
    assert cost.step_time(40, rows=8) == pytest.approx(a + b * 40 + q * 8, rel=0.05)
    assert cost.load_cost(8) == pytest.approx(b * 8 / (a + (b + q) * 8), rel=0.15)


def test_rows_read_as_tokens_overprice_a_draft():
    """The fit without rows (every token a row, as before) takes part of a row's cost
    for a token's: with a row 1.7x a token it prices a draft token at 1.28x what it
    costs (1.19x at 1.5x, 1.43x at 2x)."""
    a, b, q = 0.046, 2.6e-3, 1.8e-3
    rng = random.Random(4)
    with_rows, without = StepCost(), StepCost()
    for n, _, rows in _verifying_steps(rng, 2000):
        t = a + b * n + q * rows
        with_rows.observe_target_step(t, n, 0, rows)
        without.observe_target_step(t, n)
    true_v = b * 8 / (a + (b + q) * 8)
    assert with_rows.load_cost(8) == pytest.approx(true_v, rel=1e-6)
    assert without.load_cost(8) > 1.2 * true_v


def test_rows_in_lockstep_with_tokens_keep_the_token_fit():
    """Every row verifying the same k (n = (1 + k)·R): rows cannot be told from tokens;
    q keeps its last identified value (0 before one) and the step is still predicted."""
    a, b = 0.02, 1e-3
    lock = StepCost()
    for rows in (1, 2, 4, 8, 16) * 10:
        lock.observe_target_step(a + b * 4 * rows, 4 * rows, 0, rows)
    assert lock.price().per_row_s == 0.0
    assert lock.price().per_token_s == pytest.approx(b, rel=1e-6)
    assert lock.step_time(32, rows=8) == pytest.approx(a + b * 32, rel=1e-6)
    # once k varies, q is identified; back in lockstep it stays
    known = StepCost()
    q = 3e-3
    for n, _, rows in _verifying_steps(random.Random(6), 500):
        known.observe_target_step(a + b * n + q * rows, n, 0, rows)
    for rows in (1, 2, 4, 8, 16) * 40:
        known.observe_target_step(a + b * 4 * rows + q * rows, 4 * rows, 0, rows)
    assert known.price().per_row_s == pytest.approx(q, rel=1e-3)
    assert known.price().per_token_s == pytest.approx(b, rel=1e-3)
    with pytest.raises(ValueError):
        StepCost().observe_target_step(0.01, 4, 0, 5)  # more rows than tokens


def _summarize_module():
    """experiments/step_log/summarize.py (a script, not a package module), loaded."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "summarize", Path(__file__).parents[2] / "experiments/step_log/summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_log_line_carries_the_prediction_made_before_the_step(caplog):
    """With ``vllm.specdec_plugin.steps`` at DEBUG, each recorded step logs its timers and
    the fit's prediction from before it saw the step, in the form
    experiments/step_log/summarize.py parses; nothing is logged at INFO."""
    import logging

    from vllm_specdec_plugin.step_record import StepRecorder

    summarize = _summarize_module()
    cost = StepCost()
    for b in (2, 4, 8):
        cost.observe_target_step(0.010 + 0.002 * b, b)  # plain steps
    rec = StepRecorder(cost, SimpleNamespace(target_step=lambda *a: None), 0.2)
    requests = {r: SimpleNamespace(seen=True, drafted=[], credit=0.0) for r in "abcd"}
    requests["a"].drafted = [7, 8]
    for level in (logging.INFO, logging.DEBUG):
        caplog.clear()
        before = cost.step_time(6, rows=4)
        with caplog.at_level(level, logger="vllm.specdec_plugin.steps"):
            rec.begin(None)
            rec.end([[1, 2, 3], [1], [1], [1]], list("abcd"), requests, 0.0)
        lines = [r.getMessage() for r in caplog.records if "specdec step:" in r.getMessage()]
        assert len(lines) == (level == logging.DEBUG)
    step = summarize.LINE.search(lines[0])
    assert [int(step.group(i)) for i in range(4, 9)] == [6, 0, 4, 1, 6]  # n m rows verify emitted
    assert float(step.group(9)) == pytest.approx(1e3 * before, abs=0.01)
    cost.target.solve()  # the fit re-solves every few steps: now, to see this one
    assert before != pytest.approx(cost.step_time(6, rows=4))  # the step was observed after


def test_target_fit_solves_every_few_steps_and_first_at_once():
    """The sums take every step; the solve waits for STEP_FIT_SOLVE_EVERY new steps
    (the first read solves at once), and ``solve`` forces it; price() is rebuilt only
    after a solve."""
    from vllm_specdec_plugin.tuning import STEP_FIT_SOLVE_EVERY

    cost = StepCost()
    cost.observe_target_step(0.012, 1)
    assert cost.step_time(1) == pytest.approx(0.012)  # first read: solved
    first = cost.price()
    for i in range(STEP_FIT_SOLVE_EVERY - 1):  # 7 more, within 2x of 12 ms: not yet
        n = 2 + i % 3
        cost.observe_target_step(0.010 + 0.002 * n, n)
        assert cost.price() is first
    cost.observe_target_step(0.010 + 0.002 * 2, 2)  # the 8th since the solve
    assert cost.price() is not first
    assert cost.price().per_token_s > 0
    cost.observe_target_step(0.010 + 0.002 * 3, 3)
    stale = cost.price()
    cost.target.solve()
    assert cost.price() is not stale


def test_a_step_the_fit_mispredicts_by_more_than_the_surprise_factor_solves_at_once():
    """A young fit that has seen one row meets a batch of 8 (a start burst): the first
    such step, 2x off or more, makes the next read solve instead of waiting 8 steps."""
    from vllm_specdec_plugin.tuning import STEP_FIT_SURPRISE

    cost = StepCost()
    for n in (1, 2, 3) * 4:
        cost.observe_target_step(0.020 + 0.002 * n, n)
    young = cost.price()
    assert cost.price() is young
    cost.observe_target_step(young.seconds(8) * 1.5, 8)  # off, but within the factor
    assert cost.price() is young
    cost.observe_target_step(young.seconds(8) / (STEP_FIT_SURPRISE * 1.1), 8)
    assert cost.price() is not young


def test_step_log_summary_prices_verifying_steps_against_measured_plain_ones():
    """summarize.py's by-batch lines and saved seconds: a verifying step is priced against
    the plain steps of its batch band as measured (the fit's prediction x their measured /
    predicted ratio), so a fit that runs 10 % short cancels; idle gaps split the cells."""
    summarize = _summarize_module()

    def step(s, verify, emitted, gap=2.0):
        return {"s": s, "exact": 0.0, "gap": gap, "n": emitted, "m": 0, "rows": 8,
                "verify": verify, "emitted": emitted, "pred": 100.0, "plain": 100.0, "sigma": 0.0}

    # plain steps measured 110 ms against 100 predicted; the verifying one took 165 ms for
    # 2 tokens a row, where plain steps would have taken 2 x 110 = 220 ms: it saved 55 ms
    cell = [step(110.0, False, 8), step(110.0, False, 8), step(165.0, True, 16)]
    saved, busy = summarize.saved(cell)
    assert saved == pytest.approx(0.055)
    assert busy == pytest.approx((110 + 110 + 165 + 6) / 1e3)
    line, = summarize.by_batch(cell)
    assert "tokens/row 2.00" in line and "against plain 1.50" in line and "realised S 1.33" in line
    assert [len(p) for p in summarize.stretches(cell + [step(110.0, False, 8, gap=5000.0)] + cell)] == [3, 4]


# -- the step timer's token split ----------------------------------------------------

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


# -- modules that must not need vLLM or torch ----------------------------------------

PURE = {  # module -> the package modules it may import (each itself pure)
    "tuning": set(),
    "speedup": {"tuning"},
    "step_cost": {"catch_up", "target_fit", "tuning"},
    "target_fit": {"tuning"},
    "catch_up": {"speedup", "tuning"},
    "step_record": {"row_credit", "step_cost", "tuning"},
    "row_credit": {"tuning"},
    "adaptive": {"speedup", "step_cost", "tenancy", "tuning"},
    "match_pricing": {"speedup", "tuning"},
    "batch_check": {"match_pricing", "speedup", "tuning"},
    "shadow": {"tuning"},
    "tenancy": {"ngram_corpus"},
    "ngram": {"tuning"},
    "ngram_corpus": {"ngram", "tuning"},
    "step_plan": {"speedup", "step_cost", "tuning"},
    "plan_hint": {"speedup", "step_cost", "tuning"},
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


def test_the_price_carries_sigma_once_measured():
    cost = StepCost()
    for n in (4, 8, 16, 32) * 10:
        cost.observe_target_step(0.01 + 0.001 * n, n)
    assert cost.price().verify_s == 0.0  # not measured yet
    cost.observe_spec_overhead(0.005)  # the first call (imports, allocation) is not kept
    for _ in range(3):
        cost.observe_spec_overhead(0.002)
    assert cost.price().verify_s == pytest.approx(0.002)
