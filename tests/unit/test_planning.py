"""The planner (``planning``): each row's offers (n-gram lookup, own history against the
cross-request corpus, priced by match bucket; the draft model with its catch-up), the
plans once the policy decided, and the round's feed budget (no vLLM)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_specdec_plugin.control.acceptance import (Acceptance, ScopeRecord, expected_tokens,
                                                    match_key)
from vllm_specdec_plugin.control.cost import Prices
from vllm_specdec_plugin.control.policy import Offer, RowView, StepView, decide
from vllm_specdec_plugin.kv import BlockAllocator
from vllm_specdec_plugin.planning import Plan, Planner
from vllm_specdec_plugin.request_state import RequestState
from vllm_specdec_plugin.tenancy import UNSALTED
from vllm_specdec_plugin.tuning import MIN_GAIN, PRIOR_ALPHA

pytestmark = pytest.mark.unit

# a plain step of 70 ms; a verify token 0.5 % of it, a draft position 0.3 %; a token fed
# to the draft 0.1 ms
PRICES = Prices(plain_s=0.07, verify=0.005, sigma=0.0, draft_token=0.003,
                catch_up=1e-4 / 0.07, prefill=2e-4 / 0.07)


def _planner(method: str = "ngram", k: int = 8, max_model_len: int = 1024,
             corpus_tokens: int = 4096, scope: str = "salt", budget: int = 2048,
             reasons: list | None = None) -> Planner:
    return Planner(method, k, max_model_len, corpus_tokens, scope, budget,
                   (reasons if reasons is not None else []).append)


def _req(scope: ScopeRecord | None = None, **kw) -> RequestState:
    return RequestState(scope=UNSALTED, learned=Acceptance(scope or ScopeRecord()), **kw)


def _drafts(planner: Planner, context: list[int], k: int) -> list[int]:
    row = np.asarray(context, dtype=np.int64)
    return planner._ngram_drafts(_req(), row, len(context), k)[0]


def _row(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


# -- n-gram lookup -------------------------------------------------------------------------

def test_a_replay_of_periodic_output_drafts_the_period_past_the_corpus_end():
    """A finished request's output repeats with period 5, so the newest corpus occurrence
    of the replay's context is at the end of that sequence: 1 token left after it. The
    corpus chain looks up again from the drafts and continues the period."""
    prompt = list(range(100, 140))
    period = [7, 8, 9, 10, 11]
    finished = prompt + period * 12
    planner = _planner(k=8)
    planner.corpus.add(UNSALTED, finished)
    replay = prompt + period * 6 + period[:4]     # mid-output, aligned with the period
    corpus_drafts, n = planner.corpus.get(UNSALTED).propose(replay, 8)
    assert corpus_drafts == (period * 3)[4:12] and n > 4
    assert _drafts(planner, replay, 8) == (period * 3)[4:12]


def test_the_own_history_run_extends_a_corpus_chain_that_stops_short():
    """The corpus chain stops where no stored n-gram follows (its sequence ends); the
    replay's own history proposes the same token and more: that run is taken."""
    prompt = list(range(100, 140))
    finished = prompt + [7, 8, 9]
    planner = _planner(k=6)
    planner.corpus.add(UNSALTED, finished)
    replay = prompt + [7, 8] + prompt[-6:] + [7, 8]  # own history: 7, 8 -> 9 -> ... again
    corpus_drafts, n = planner.corpus.get(UNSALTED).propose(replay, 6)
    own, match = planner._ngram_drafts(_req(), _row(replay), len(replay), 6)
    assert corpus_drafts == [9] and own[:1] == [9]
    assert match == match_key("corpus", n)


def test_the_corpus_run_wins_where_own_history_disagrees_or_offers_no_more():
    """A replay of a non-periodic output: the corpus continuation (aligned, full length)
    is taken; own history matches only a shorter context there."""
    rng = np.random.default_rng(0)
    finished = rng.integers(0, 1000, size=200).tolist()
    planner = _planner(k=6)
    planner.corpus.add(UNSALTED, finished)
    replay = finished[:120]
    assert _drafts(planner, replay, 6) == finished[120:126]


def _hybrid_replay(k: int) -> tuple[Planner, list[int], list[int]]:
    """A hybrid planner whose corpus holds a finished request, and a replay of it
    (prompt and part of the output): (planner, replay, the rest of the output)."""
    rng = np.random.default_rng(1)
    finished = rng.integers(0, 1000, size=160).tolist()
    planner = _planner("hybrid", k=k)
    planner.corpus.add(UNSALTED, finished)
    return planner, finished[:100], finished[100:]


def test_a_long_corpus_match_is_priced_by_its_bucket_and_outbids_the_draft_model():
    """A new request replays a finished one: the corpus match reaches 64+ tokens back.
    Where matches that long were accepted 39 times in 40 (by the scope's earlier
    requests), the proposal is priced near that, outbids the draft model, and the
    policy drafts all of it."""
    k = 24
    planner, replay, rest = _hybrid_replay(k)
    scope = ScopeRecord()
    req = _req(scope)
    view, lookup = planner.offers(req, len(replay), _row(replay), None, PRICES)
    key = lookup.match
    assert key[0] == "corpus" and key[1] >= match_key("corpus", 64)[1]
    earlier = Acceptance(scope)
    for _ in range(10):
        earlier.observe("ngram", 24, 24, key)
    earlier.observe("ngram", 24, 0, key)
    view, lookup = planner.offers(req, len(replay), _row(replay), None, PRICES)
    ngram, model = view.offers
    assert (ngram.source, model.source) == ("ngram", "draft")
    assert ngram.alpha == pytest.approx(req.learned.match_alpha(key)) and ngram.alpha > 0.9
    assert model.alpha == pytest.approx(PRIOR_ALPHA)
    assert ngram.k == len(lookup.drafts) == k
    d = decide(StepView(1, PRICES.verify, PRICES.sigma), [view])
    assert d.ks == [("ngram", k)]
    plan = planner.plan(0, "r", req, len(replay), _row(replay), "ngram", k, lookup)
    assert plan.drafts == rest[:k] and plan.match == key and plan.new_tokens == []


def test_without_bucket_evidence_the_proposal_is_priced_at_the_requests_ngram_alpha():
    planner, replay, _ = _hybrid_replay(24)
    req = _req()
    for _ in range(5):
        req.learned.observe("ngram", 4, 1, match_key("own", 2))  # another bucket's rounds
    view, lookup = planner.offers(req, len(replay), _row(replay), None, PRICES)
    assert view.offers[0].source == "ngram"
    assert view.offers[0].alpha == pytest.approx(req.learned.alpha("ngram"))
    assert view.offers[0].alpha < PRIOR_ALPHA


def test_a_request_near_its_max_tokens_is_offered_only_what_it_can_emit():
    """end = prompt + max_tokens: a round emits up to k + 1 tokens, so 3 tokens left
    allow 2 drafts, and 1 token left none (no offer, no lookup)."""
    planner = _planner(k=6, max_model_len=1024)
    finished = np.random.default_rng(0).integers(0, 1000, size=200).tolist()
    planner.corpus.add(UNSALTED, finished)
    replay = finished[:120]
    row = _row(replay)
    view, lookup = planner.offers(_req(), len(replay), row, len(replay) + 3, PRICES)
    assert [(o.source, o.k) for o in view.offers] == [("ngram", 2)]
    assert lookup.drafts == finished[120:122]
    view, lookup = planner.offers(_req(), len(replay), row, 2000, PRICES)
    assert lookup.drafts == finished[120:126]  # max_model_len bounds, then k
    view, lookup = planner.offers(_req(), len(replay), row, len(replay) + 1, PRICES)
    assert view.offers == [] and lookup is None
    assert planner.room(len(replay), len(replay) + 1) == 0
    assert planner.room(1020, None) == 3  # max_model_len 1024
    assert planner.shadow_drafts(_req(), row, len(replay), 8, len(replay) + 3)[0] == \
        finished[120:122]
    assert planner.shadow_drafts(_req(), row, len(replay), 8, len(replay) + 1) == ([], None)


def test_offers_carry_the_requests_budget_and_every_source():
    planner, replay, _ = _hybrid_replay(8)
    req = _req()
    req.credit = -0.3
    view, _ = planner.offers(req, len(replay), _row(replay), None, PRICES)
    assert view.credit == -0.3 and [o.source for o in view.offers] == ["ngram", "draft"]
    assert req.seen and req.length == len(replay)  # the round saw it


# -- the draft model's offer and its catch-up ----------------------------------------------

def _draft_planner(k: int = 8, max_model_len: int = 4096) -> Planner:
    return _planner("draft", k=k, max_model_len=max_model_len, corpus_tokens=0)


def _random_row(n: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 1000, size=n).astype(np.int64)


def test_a_draft_that_is_caught_up_pays_only_its_positions():
    planner = _draft_planner()
    row = _random_row(800)
    req = _req(tokens=row[:799].tolist())  # fed up to the last committed token
    view, lookup = planner.offers(req, 800, row, 864, PRICES)
    assert lookup is None
    assert view.offers == [Offer("draft", PRIOR_ALPHA, 8, PRICES.draft_token)]
    before = Prices(0.0, 0.0, 0.0, 0.05 / 8, 0.0, 0.0)  # before any target step
    view, _ = planner.offers(req, 800, row, 864, before)
    assert view.offers == [Offer("draft", PRIOR_ALPHA, 8, 0.05 / 8)]


def test_a_draft_that_lags_a_whole_history_under_load_is_not_chosen():
    """At B = 16 a token fed costs 0.1 ms / 70 ms = 0.0014 plain steps: 750 committed
    tokens the draft has not seen delay the step by 1.07 plain steps, and the 64 tokens
    left spread that over ~20 rounds: 0.052 a round, more than the whole step could
    gain. Caught up, the same request drafts."""
    planner = _draft_planner()
    row = _random_row(800)
    req = _req(tokens=row[:50].tolist())
    (offer,) = planner.offers(req, 800, row, 864, PRICES)[0].offers
    e = expected_tokens(PRIOR_ALPHA, 8)
    assert offer.now == pytest.approx(749 * PRICES.catch_up)
    assert offer.once == pytest.approx(offer.now / (64 / e))
    view = StepView(16, PRICES.verify, PRICES.sigma)
    lagging = planner.offers(req, 800, row, 864, PRICES)[0]
    best = max((16 + expected_tokens(offer.alpha, k) - 1)
               / (1 + k * (PRICES.verify + offer.cost) + offer.once) for k in range(1, 9))
    assert best < 16 * (1 + MIN_GAIN)  # no prefix pays: the policy is right to hold it
    assert decide(view, [lagging]).ks == [("", 0)]
    fed = planner.offers(_req(tokens=row[:799].tolist()), 800, row, 864, PRICES)[0]
    assert decide(view, [fed]).ks[0][0] == "draft"


def test_a_new_request_alone_catches_up_its_prompt_over_its_answer():
    """At B = 1 a 300-token prompt is 0.43 plain steps, spread over a 256-token answer;
    the draft is chosen and fed the prompt (in full against a first token's room)."""
    planner = _draft_planner()
    row = _random_row(301)
    req = _req()
    view, _ = planner.offers(req, 301, row, 301 + 256, PRICES)
    (offer,) = view.offers
    now = 300 * PRICES.catch_up  # 301 fed, one of them fed anyway
    assert offer.now == pytest.approx(now)
    assert offer.once == pytest.approx(now / (256 / expected_tokens(PRIOR_ALPHA, 8)))
    d = decide(StepView(1, PRICES.verify, PRICES.sigma), [view])
    goodput = [(expected_tokens(PRIOR_ALPHA, k)) / (1 + k * (PRICES.verify + offer.cost)
                                                     + offer.once) for k in range(1, 9)]
    k = 1 + goodput.index(max(goodput))
    assert d.ks == [("draft", k)] and k > 4  # the best k for the ratio, catch-up included
    plan = planner.plan(0, "r", req, 301, row, "draft", k, None)
    assert plan.new_tokens == row[:301].tolist() and plan.k == k and plan.drafts == []
    # the whole catch-up against a first token's room of 0.2 plain steps: held
    assert decide(StepView(1, PRICES.verify, PRICES.sigma, first_token_room=0.2),
                  [view]).why == ["first_token"]


def test_the_horizon_is_the_scopes_typical_answer_when_max_tokens_is_far():
    """No max_tokens (end None: up to max_model_len) would spread the catch-up over
    ~3,500 tokens; the scope's finished answers (median 40) bound the horizon."""
    planner = _draft_planner()
    row = _random_row(600)
    scope = ScopeRecord()
    lagging = lambda: _req(scope, tokens=row[:10].tolist())  # noqa: E731
    (far,) = planner.offers(lagging(), 600, row, None, PRICES)[0].offers
    e = expected_tokens(PRIOR_ALPHA, 8)
    assert far.once == pytest.approx(far.now / ((4096 - 600) / e))
    for n in (30, 40, 50):
        scope.outputs.append(n)
    (near,) = planner.offers(lagging(), 600, row, None, PRICES)[0].offers
    assert near.once == pytest.approx(near.now / (40 / e)) and near.now == far.now
    view = StepView(16, PRICES.verify, PRICES.sigma)
    assert decide(view, [planner.offers(lagging(), 600, row, None, PRICES)[0]]).ks == [("", 0)]
    assert decide(view, [RowView([far])]).ks[0][0] == "draft"


def test_a_request_counts_its_output_from_its_first_round():
    req = RequestState()
    assert req.output_tokens == 0
    req.round_at(101)  # prompt of 100 and its first token
    req.round_at(140)
    assert req.output_tokens == 40 and req.seen


# -- the round's feed budget ---------------------------------------------------------------

def test_the_round_feeds_within_the_room_smallest_first_and_chunks_the_rest():
    """Room 100: the rows feeding 1 and 5 tokens draft; a 300-token prompt feeds the
    94 left and drafts nothing this round (counted); with the room lifted it feeds all
    (vLLM's token budget still bounds it)."""
    def fit(room: int | None, budget: int = 2048) -> tuple[list[Plan], list[str]]:
        reasons: list[str] = []
        planner = _planner("draft", k=4, max_model_len=4096, budget=budget, reasons=reasons)
        planner.allocator = BlockAllocator(num_blocks=64, block_size=16)
        plans = [Plan(row=r, req_id=str(r), req=RequestState(), new_tokens=[7] * n,
                      length=n, k=k) for r, (n, k) in enumerate(((300, 4), (1, 2), (5, 4)))]
        return planner.fit(plans, room), reasons

    run, reasons = fit(100)
    assert [(p.row, len(p.new_tokens), p.k) for p in run] == [(2, 5, 4), (1, 1, 2), (0, 94, 0)]
    assert reasons == ["prefill_budget"]
    run, reasons = fit(None)
    assert sorted((p.row, len(p.new_tokens), p.k) for p in run) == [(0, 300, 4), (1, 1, 2),
                                                                    (2, 5, 4)]
    assert [p.k for p in run] == [4, 4, 2] and reasons == []
    run, reasons = fit(None, budget=6)  # vLLM's budget: 1 + 5 fed, nothing left for 300
    assert sorted((p.row, len(p.new_tokens), p.k) for p in run) == [(1, 1, 2), (2, 5, 4)]
    assert reasons == ["prefill_budget"]


def test_a_plan_the_pool_cannot_hold_drafts_nothing():
    reasons: list[str] = []
    planner = _planner("draft", k=4, max_model_len=4096, reasons=reasons)
    planner.allocator = BlockAllocator(num_blocks=2, block_size=16)
    plans = [Plan(row=0, req_id="a", req=RequestState(), new_tokens=[7] * 20, length=20, k=4),
             Plan(row=1, req_id="b", req=RequestState(), new_tokens=[7] * 10, length=10, k=4)]
    run = planner.fit(plans, None)
    assert [p.req_id for p in run] == ["b"] and reasons == ["pool_full"]
    assert planner.allocator.num_used == 1


def test_a_draft_plan_refeeds_the_last_token_when_nothing_is_new():
    planner = _draft_planner()
    row = _random_row(50)
    req = _req(tokens=row[:50].tolist())
    plan = planner.plan(3, "r", req, 50, row, "draft", 2, None)
    assert plan.row == 3 and plan.new_tokens == row[49:50].tolist() and plan.k == 2
    assert plan.cached == 49
