"""The planner's n-gram lookup (own history vs the cross-request corpus) and the
pricing of its proposals by match length (no vLLM)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_specdec_plugin.config import SpecDecConfig
from vllm_specdec_plugin.match_pricing import ANY_MATCH, MatchAlpha, match_key
from vllm_specdec_plugin.planning import Plan, Planner
from vllm_specdec_plugin.request_state import RequestState
from vllm_specdec_plugin.speedup import best_k
from vllm_specdec_plugin.tenancy import UNSALTED

pytestmark = pytest.mark.unit


def _planner(k: int) -> Planner:
    config = SpecDecConfig(num_speculative_tokens=k, method="ngram", ngram_corpus_tokens=4096)
    return Planner(config, max_model_len=1024, allocator=None, no_draft=lambda reason: None)


def _drafts(planner: Planner, context: list[int], k: int) -> list[int]:
    row = np.asarray(context, dtype=np.int64)
    return planner._ngram_drafts(RequestState(scope=UNSALTED), row, len(context), k)[0]


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
    own = planner._ngram_drafts(RequestState(scope=UNSALTED), np.asarray(replay), len(replay), 6)
    assert corpus_drafts == [9] and own[0][:1] == [9]


def test_the_corpus_run_wins_where_own_history_disagrees_or_offers_no_more():
    """A replay of a non-periodic output: the corpus continuation (aligned, full length)
    is taken, as before; own history matches only a shorter context there."""
    rng = np.random.default_rng(0)
    finished = rng.integers(0, 1000, size=200).tolist()
    planner = _planner(k=6)
    planner.corpus.add(UNSALTED, finished)
    replay = finished[:120]
    assert _drafts(planner, replay, 6) == finished[120:126]


def _hybrid_replay(k: int) -> tuple[Planner, list[int], list[int]]:
    """A hybrid adaptive planner whose corpus holds a finished request, and a replay of
    it (prompt and part of the output): (planner, replay, the rest of the output)."""
    rng = np.random.default_rng(1)
    finished = rng.integers(0, 1000, size=160).tolist()
    config = SpecDecConfig(num_speculative_tokens=k, method="hybrid", adaptive=True,
                           draft_model="unused", ngram_corpus_tokens=4096)
    planner = Planner(config, max_model_len=1024, allocator=None, no_draft=lambda reason: None)
    planner.corpus.add(UNSALTED, finished)
    return planner, finished[:100], finished[100:]


def _estimates(prices: MatchAlpha, request_alpha: float, global_alpha: float,
               cost: float, fixed: float) -> dict:
    """Estimates as the proposer hands them over: the n-gram α priced by match bucket
    (``request_alpha`` unpriced), the draft model at α 0.85 and cost 0.15."""
    return {"ngram": (lambda rid, match=None: request_alpha if match is None
                      else prices.alpha(match, request_alpha, global_alpha), cost, fixed),
            "draft": (lambda rid: 0.85, 0.15, fixed)}


def _plan(planner: Planner, context: list[int], choices, estimates) -> Plan | None:
    row = np.asarray(context, dtype=np.int64)
    return planner.plan(0, "r", RequestState(scope=UNSALTED), len(context), row, choices, estimates)


def test_a_long_corpus_match_is_priced_by_its_bucket_and_drafted_at_its_optimum_k():
    """A new request (the n-gram α is the global 0.6, at which the controller wants 4
    drafts) replays a finished one: the corpus match reaches 64 tokens back. Where
    matches that long were accepted 39 times in 40, the proposal is priced near that,
    outbids the draft model (α 0.85) and drafts the optimum k at that price, past the
    controller's 4."""
    k, g, cost, fixed = 24, 0.6, 0.05, 0.05
    planner, replay, rest = _hybrid_replay(k)
    key = match_key("corpus", 64)
    prices = MatchAlpha()
    for _ in range(10):
        prices.observe(key, drafted=24, accepted=24)
    prices.observe(key, drafted=24, accepted=0)
    estimates = _estimates(prices, g, g, cost, fixed)
    choices = {"ngram": {"r": (best_k(g, cost, k, 0.02, fixed), "")},
               "draft": {"r": (8, "")}}
    assert choices["ngram"]["r"][0] == 4
    plan = _plan(planner, replay, choices, estimates)
    assert plan is not None and plan.match == key
    assert plan.alpha == pytest.approx(prices.bucket_alpha(key, g)) and plan.alpha > 0.9
    assert plan.k == best_k(plan.alpha, cost, k, 0.02, fixed) > 4
    assert plan.drafts == rest[:plan.k]


def test_without_bucket_evidence_the_proposal_gets_the_controllers_k():
    """No rounds in any bucket: the price is the request's α, so the n-gram offer is the
    controller's k and the draft model wins as before."""
    k, g, cost, fixed = 24, 0.6, 0.05, 0.05
    planner, replay, _ = _hybrid_replay(k)
    prices = MatchAlpha()
    estimates = _estimates(prices, g, g, cost, fixed)
    choices = {"ngram": {"r": (4, "")}, "draft": {"r": (8, "")}}
    offer = planner._ngram_offer("r", RequestState(scope=UNSALTED), len(replay),
                                 np.asarray(replay, dtype=np.int64), choices, estimates, k)
    assert isinstance(offer, Plan) and offer.k == 4 and offer.alpha == pytest.approx(g)
    plan = _plan(planner, replay, choices, estimates)
    assert plan is not None and not plan.drafts and plan.k == 8  # the draft model


def _counting_lookups(planner: Planner) -> list[int]:
    """The k of every n-gram lookup the planner runs from now on."""
    ks: list[int] = []
    lookup = planner._ngram_drafts
    planner._ngram_drafts = lambda req, row, length, k: ks.append(k) or lookup(req, row, length, k)
    return ks


def test_the_lookup_runs_only_as_far_as_the_best_price_could_pay():
    """Before its lookup a request's offer is bounded by the most any match could be
    priced (ANY_MATCH): without strong buckets the lookup stops at the optimum k of
    the request's α, and a request held at 0 for "adaptive" is not looked up at all;
    with a strong bucket both look up to what that price would draft."""
    k, g, cost, fixed = 24, 0.6, 0.05, 0.05
    planner, replay, rest = _hybrid_replay(k)
    prices = MatchAlpha()
    estimates = _estimates(prices, g, g, cost, fixed)
    row = np.asarray(replay, dtype=np.int64)
    looked = _counting_lookups(planner)
    offer = planner._ngram_offer("r", RequestState(scope=UNSALTED), len(replay), row,
                                 {"ngram": {"r": (4, "")}}, estimates, k)
    assert isinstance(offer, Plan) and offer.k == 4
    assert looked == [best_k(g, cost, k, 0.02, fixed)] and looked[0] < k
    held = {"ngram": {"r": (0, "adaptive")}}
    estimates_low = _estimates(prices, 0.05, g, cost, fixed)
    assert planner._ngram_offer("r", RequestState(scope=UNSALTED), len(replay), row, held,
                                estimates_low, k) == "adaptive"
    assert len(looked) == 1  # no lookup: nothing it could find would pay
    key = match_key("corpus", 64)
    for _ in range(10):
        prices.observe(key, drafted=24, accepted=24)
    offer = planner._ngram_offer("r", RequestState(scope=UNSALTED), len(replay), row, held,
                                 estimates_low, k)
    assert looked[1] == best_k(prices.alpha(ANY_MATCH, 0.05, g), cost, k, 0.02, fixed) > 4
    assert isinstance(offer, Plan) and offer.match == key and offer.drafts == rest[:offer.k]


def test_a_request_near_its_max_tokens_drafts_only_what_it_can_emit():
    """end = prompt + max_tokens: a round emits up to k + 1 tokens, so 3 tokens left
    allow 2 drafts, and 1 token left none (counted "length_guard")."""
    reasons: list[str] = []
    config = SpecDecConfig(num_speculative_tokens=6, method="ngram", ngram_corpus_tokens=4096)
    planner = Planner(config, max_model_len=1024, allocator=None, no_draft=reasons.append)
    finished = np.random.default_rng(0).integers(0, 1000, size=200).tolist()
    planner.corpus.add(UNSALTED, finished)
    replay = finished[:120]
    row = np.asarray(replay, dtype=np.int64)
    plan = planner.plan(0, "r", RequestState(scope=UNSALTED), len(replay), row, {}, None, end=len(replay) + 3)
    assert plan is not None and plan.drafts == finished[120:122]
    plan = planner.plan(0, "r", RequestState(scope=UNSALTED), len(replay), row, {}, None, end=2000)
    assert plan is not None and plan.drafts == finished[120:126]  # max_model_len bounds
    assert planner.plan(0, "r", RequestState(scope=UNSALTED), len(replay), row, {}, None,
                        end=len(replay) + 1) is None
    assert reasons == ["length_guard"]


def test_a_load_probe_step_drafts_in_hybrid_where_no_source_pays():
    """Under load (a draft token costs ~ a plain step) neither source pays, so a hybrid
    round drafts nothing, probe or not; on a load probe step (every row k = 1 from its
    controller) the best source drafts anyway, so the cost fit sees a verifying step."""
    planner, replay, rest = _hybrid_replay(8)
    estimates = {"ngram": (lambda rid, match=None: 0.6, 0.99, 0.05),
                 "draft": (lambda rid: 0.6, 0.99, 0.05)}
    choices = {"ngram": {"r": (1, "")}, "draft": {"r": (1, "")}}
    assert _plan(planner, replay, choices, estimates) is None
    row = np.asarray(replay, dtype=np.int64)
    plan = planner.plan(0, "r", RequestState(scope=UNSALTED), len(replay), row, choices,
                        estimates, load_probe=True)
    assert plan is not None and plan.k == 1 and plan.drafts == rest[:1]
