"""Acceptance by match bucket, combined with a request's α in log-odds (no vLLM)."""

from __future__ import annotations

import pytest

from vllm_specdec_plugin.match_pricing import ANY_MATCH, MatchAlpha, match_key

pytestmark = pytest.mark.unit


def test_buckets_own_history_by_n_and_the_corpus_by_powers_of_two():
    assert match_key("own", 3) == ("own", 3)
    assert match_key("corpus", 3) == match_key("corpus", 2) != match_key("corpus", 4)
    assert match_key("corpus", 64) != match_key("corpus", 63) == match_key("corpus", 32)
    with pytest.raises(ValueError, match="'own' or 'corpus'"):
        match_key("suffix", 3)


def test_without_evidence_either_side_the_other_stands():
    prices = MatchAlpha()
    key = match_key("corpus", 40)
    assert prices.alpha(key, 0.8, 0.6) == pytest.approx(0.8)  # no bucket rounds
    for _ in range(20):
        prices.observe(key, drafted=8, accepted=8)
    assert prices.bucket_alpha(key, 0.6) > 0.95
    # a request never observed has the global α: it gets the bucket's
    assert prices.alpha(key, 0.6, 0.6) == pytest.approx(prices.bucket_alpha(key, 0.6))


def test_request_and_bucket_effects_add_in_log_odds():
    """A request better than average gets a long match priced above the bucket, one
    worse than average below it; a short-match bucket that fails pulls both down."""
    prices = MatchAlpha()
    long_, short = match_key("corpus", 40), match_key("own", 1)
    for _ in range(20):
        prices.observe(long_, drafted=8, accepted=7)
        prices.observe(short, drafted=4, accepted=0)
    b = prices.bucket_alpha(long_, 0.6)
    assert prices.alpha(long_, 0.8, 0.6) > b > prices.alpha(long_, 0.4, 0.6)
    assert prices.alpha(short, 0.8, 0.6) < 0.8
    assert 0.0 < prices.alpha(short, 0.0, 0.6) < prices.alpha(long_, 0.999, 0.6) <= 0.999


def test_counts_decay_and_bad_rounds_are_refused():
    prices = MatchAlpha(decay=0.5)
    key = match_key("own", 4)
    for _ in range(10):
        prices.observe(key, drafted=4, accepted=0)
    for _ in range(10):
        prices.observe(key, drafted=4, accepted=4)
    assert prices.bucket_alpha(key, 0.6) > 0.85  # the old failures are forgotten (0.79 without decay)
    prices.observe(key, drafted=0, accepted=0)  # no information: no change
    with pytest.raises(ValueError, match="accepted <= drafted"):
        prices.observe(key, drafted=2, accepted=3)
    with pytest.raises(ValueError):
        MatchAlpha(decay=0.0)


def test_any_match_prices_the_requests_best_bucket():
    """ANY_MATCH bounds every proposal of a request before its lookup: the best
    bucket's price, or the request's own α where no bucket beats the global one."""
    prices = MatchAlpha()
    assert prices.alpha(ANY_MATCH, 0.3, 0.6) == pytest.approx(0.3)
    weak, strong = match_key("own", 2), match_key("corpus", 64)
    for _ in range(10):
        prices.observe(weak, drafted=4, accepted=0)
    assert prices.alpha(ANY_MATCH, 0.3, 0.6) == pytest.approx(0.3)  # an empty bucket's
    for _ in range(10):
        prices.observe(strong, drafted=8, accepted=8)  # the cached bound is renewed
    best = prices.alpha(ANY_MATCH, 0.3, 0.6)
    assert best == pytest.approx(prices.alpha(strong, 0.3, 0.6)) and best > 0.3
    assert all(prices.alpha(key, r, g) <= prices.alpha(ANY_MATCH, r, g)
               for key in (weak, strong, match_key("own", 4))
               for r in (0.1, 0.6, 0.95) for g in (0.3, 0.6, 0.9))
