"""Pricing a lagging draft KV: the pass-1 fit, the amortised price, the horizon, and the
planner's choice of source with it (no vLLM)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_specdec_plugin.batch_check import _priced
from vllm_specdec_plugin.catch_up import CatchUpFit, OutputLengths, round_cost
from vllm_specdec_plugin.config import SpecDecConfig
from vllm_specdec_plugin.kv import BlockAllocator
from vllm_specdec_plugin.planning import Plan, Planner
from vllm_specdec_plugin.request_state import RequestState
from vllm_specdec_plugin.speedup import expected_tokens
from vllm_specdec_plugin.step_cost import StepCost
from vllm_specdec_plugin.tenancy import UNSALTED
from vllm_specdec_plugin.tuning import CATCH_UP_STEP_MAX

pytestmark = pytest.mark.unit


def test_the_fit_reads_seconds_per_token_until_the_feed_varies_then_the_slope():
    fit = CatchUpFit(0.8)
    assert fit.per_token() is None
    fit.add(0.010, 16)  # one size only: the forward's fixed cost is read as tokens
    assert fit.per_token() == pytest.approx(0.010 / 16)
    for n in (16, 200, 40, 900, 16, 300):  # 4 ms a pass + 0.1 ms a token
        fit.add(0.004 + 1e-4 * n, n)
    assert fit.per_token() == pytest.approx(1e-4, rel=0.05)


def test_a_slope_noise_makes_negative_falls_back_to_the_upper_bound():
    fit = CatchUpFit(1.0)
    fit.add(0.02, 10)
    fit.add(0.01, 100)  # more tokens, less time: noise
    assert fit.per_token() == pytest.approx(0.03 / 110)


def test_step_cost_prices_a_token_fed_in_plain_steps_at_the_batch():
    cost = StepCost()
    assert cost.catch_up_cost(16) == 0.0  # nothing measured
    for n in (4, 8, 16, 32) * 10:
        cost.observe_target_step(0.02 + 0.002 * n, n)
    for n in (16, 200, 40, 900):
        cost.observe_catch_up(0.004 + 1e-4 * n, n)
    assert cost.catch_up_cost(16) == pytest.approx(1e-4 / cost.step_time(16), rel=0.05)
    assert cost.snapshot()["catch_up_b"] == pytest.approx(1e-4, rel=0.05)
    with pytest.raises(ValueError, match="catch-up"):
        cost.observe_catch_up(0.01, 0)


def test_a_round_may_feed_one_plain_steps_worth_where_other_rows_wait():
    """T(B) = 20 ms + 2 ms a token, b_c = 0.1 ms: at B = 8 a round may feed 36 ms /
    0.1 ms = 360 tokens; never fewer than one a row; a lone row and an unmeasured fit
    are not bounded."""
    cost = StepCost()
    assert cost.catch_up_room(8) is None  # nothing measured
    for n in (4, 8, 16, 32) * 10:
        cost.observe_target_step(0.02 + 0.002 * n, n)
    assert cost.catch_up_room(8) is None  # no catch-up pass yet, no prefill step seen
    young = StepCost()
    # 20 ms + 2 ms a token + 1 ms a prompt token
    for n, m in ((8, 0), (1, 300), (16, 0), (1, 900)) * 5:
        young.observe_target_step(0.02 + 0.002 * n + 0.001 * m, n, m)
    room = CATCH_UP_STEP_MAX * young.step_time(8) / young.target.p  # p stands in for b_c
    assert young.catch_up_room(8) == int(room) and 35 < room < 37
    for n in (16, 200, 40, 900):
        cost.observe_catch_up(0.004 + 1e-4 * n, n)
    room = CATCH_UP_STEP_MAX * cost.step_time(8) / cost.catch_up.per_token()
    assert cost.catch_up_room(8) == int(room) and 340 < room < 380
    assert cost.catch_up_room(1) is None  # only its own catch-up delays a lone row
    slow = StepCost()
    slow.observe_target_step(0.01, 4)
    slow.observe_catch_up(1.0, 10)  # 0.1 s a token: the room would round to 0
    assert slow.catch_up_room(4) == 4


def test_the_round_feeds_within_the_room_smallest_first_and_chunks_the_rest():
    """Room 100: the rows feeding 1 and 5 tokens draft; a 300-token prompt feeds the
    94 left and drafts nothing this round (counted); with the room lifted it feeds all."""
    def fit(room: int | None) -> tuple[list[Plan], list[str]]:
        reasons: list[str] = []
        config = SpecDecConfig(num_speculative_tokens=4, method="draft",
                               draft_model="unused")
        planner = Planner(config, max_model_len=4096,
                          allocator=BlockAllocator(num_blocks=64, block_size=16),
                          no_draft=reasons.append)
        planner.catch_up_room = room
        plans = [Plan(row=r, req_id=str(r), req=RequestState(), new_tokens=[7] * n,
                      length=n, k=4) for r, n in enumerate((300, 1, 5))]
        return planner.fit(plans), reasons

    run, reasons = fit(100)
    assert sorted((p.row, len(p.new_tokens), p.k) for p in run) == [(0, 94, 0), (1, 1, 4),
                                                                    (2, 5, 4)]
    assert reasons == ["prefill_budget"]
    run, reasons = fit(None)  # only draft_prefill_budget (2048) bounds it
    assert sorted((p.row, len(p.new_tokens), p.k) for p in run) == [(0, 300, 4), (1, 1, 4),
                                                                    (2, 5, 4)]
    assert reasons == []


def test_the_catch_up_is_spread_over_the_rounds_left_and_paid_whole_at_the_end():
    alpha, k = 0.7, 4
    e = expected_tokens(alpha, k)
    assert round_cost(0, 0.5, 100, alpha, k) == 0.0
    assert round_cost(300, 0.01, 100, alpha, k) == pytest.approx(3.0 * e / 100)
    assert round_cost(300, 0.01, 2, alpha, k) == pytest.approx(3.0)  # under one round left


def test_the_typical_output_is_the_median_of_the_recent_finishes():
    out = OutputLengths()
    assert out.typical() is None
    for n in (10, 0, 200, 30):  # 0: finished before a round saw it, not counted
        out.add(n)
    assert out.typical() == 30


def _hybrid(price: float) -> Planner:
    config = SpecDecConfig(num_speculative_tokens=8, method="hybrid", adaptive=True,
                           draft_model="unused", ngram_corpus_tokens=4096)
    planner = Planner(config, max_model_len=4096, allocator=None, no_draft=lambda r: None)
    planner.catch_up_price = price
    return planner


def _row(n: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 1000, size=n).astype(np.int64)


# No n-gram match (random tokens); the draft model at α 0.7 and σ 0.02, a draft
# costing 0.05 plain steps alone and 0.3 in a busy batch (where the controller wants 1).
ESTIMATES = {"ngram": (lambda rid, match=None: 0.6, 0.05, 0.02),
             "draft": (lambda rid: 0.7, 0.05, 0.02)}
CHOICES = {"ngram": {"r": (4, "")}, "draft": {"r": (4, "")}}
BUSY = {"ngram": (lambda rid, match=None: 0.6, 0.3, 0.02), "draft": (lambda rid: 0.7, 0.3, 0.02)}
BUSY_CHOICES = {"ngram": {"r": (1, "")}, "draft": {"r": (1, "")}}


def test_a_draft_that_lags_a_whole_history_under_load_is_not_chosen():
    """At B = 16 a token fed costs the batch 16 x 0.1 ms / 70 ms = 0.023 plain steps:
    750 committed tokens the draft has not seen cost 17 plain steps, and 64 tokens
    left spread that over ~38 rounds of k = 1, 0.46 a round: S = 1.7 / (1.02 + 0.3 +
    0.46) < 1. Unpriced (S = 1.29) it drafted, as in the stalls at chat c = 16."""
    planner = _hybrid(16 * 1e-4 / 0.07)
    row = _row(800)
    req = RequestState(scope=UNSALTED, tokens=row[:50].tolist())
    assert planner.plan(0, "r", req, 800, row, BUSY_CHOICES, BUSY, end=864) is None
    # without a price (nothing measured yet) it drafts, as before
    plan = _hybrid(0.0).plan(0, "r", RequestState(scope=UNSALTED, tokens=row[:50].tolist()),
                             800, row, BUSY_CHOICES, BUSY, end=864)
    assert plan is not None and plan.k == 1 and plan.catch_up == 0.0


def test_a_new_request_alone_catches_up_its_prompt_over_its_answer():
    """At B = 1 the same prompt costs 1 x 0.1 ms / 25 ms a token: 300 tokens are 1.2
    plain steps, spread over a 256-token answer; the draft is chosen and its plan
    carries that share, which the batch check adds to its drafts' cost."""
    price = 1e-4 / 0.025
    planner = _hybrid(price)
    row = _row(301)
    plan = planner.plan(0, "r", RequestState(scope=UNSALTED), 301, row, CHOICES, ESTIMATES,
                        end=301 + 256)
    once = round_cost(300, price, 256, 0.7, 4)  # 301 fed, one of them fed anyway
    assert plan is not None and plan.k == 4 and plan.catch_up == pytest.approx(once)
    (priced,), _ = _priced([plan], ESTIMATES)
    assert priced == (0.7, 4, pytest.approx(0.05 + once / 4))


def test_the_horizon_is_the_scopes_typical_answer_when_max_tokens_is_far():
    """No max_tokens (end None: up to max_model_len) would spread the catch-up over
    ~3,500 tokens; the scope's finished answers (median 40) bound the horizon."""
    price = 16 * 1e-4 / 0.07
    row = _row(600)
    lagging = lambda: RequestState(scope=UNSALTED, tokens=row[:10].tolist())  # noqa: E731
    planner = _hybrid(price)
    assert planner.plan(0, "r", lagging(), 600, row, BUSY_CHOICES, BUSY) is not None
    for n in (30, 40, 50):
        planner.outputs.get(UNSALTED).add(n)
    assert planner.plan(0, "r", lagging(), 600, row, BUSY_CHOICES, BUSY) is None


def test_a_request_counts_its_output_from_its_first_round():
    req = RequestState()
    assert req.output_tokens == 0
    req.round_at(101)  # prompt of 100 and its first token
    req.round_at(140)
    assert req.output_tokens == 40 and req.seen
