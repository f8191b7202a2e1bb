"""What requests share: corpus and learned acceptance per cache_salt scope (no vLLM)."""

from __future__ import annotations

import pytest

from vllm_specdec_plugin.adaptive import AdaptiveConfig, AdaptiveK
from vllm_specdec_plugin.config import SpecDecConfig
from vllm_specdec_plugin.errors import SpecDecConfigError
from vllm_specdec_plugin.ngram_corpus import CorpusIndex
from vllm_specdec_plugin.planning import Planner
from vllm_specdec_plugin.tenancy import UNSALTED, ScopedCorpus, ScopedStore, scope_key

pytestmark = pytest.mark.unit

TEXT = list(range(100, 160))


def _corpus(max_tokens: int = 1000) -> ScopedCorpus:
    return ScopedCorpus(max_tokens, lambda: CorpusIndex(max_tokens, 4, 3))


def test_scope_keys_follow_the_prefix_cache_rule():
    assert scope_key("salt", "a") == ("salt", "a") != scope_key("salt", "b")
    assert scope_key("salt", None) == UNSALTED != scope_key("salt", "a")
    assert scope_key("off", "a") == ("salt", "a")  # statistics stay per salt without a corpus
    assert scope_key("global", "a") == scope_key("global", None) == ("global",)
    assert scope_key("salt", "a", known=False) is None  # salt never arrived: share nothing


def test_a_salt_drafts_only_from_its_own_finished_requests():
    corpus = _corpus()
    corpus.add(("salt", "a"), TEXT)
    assert corpus.get(("salt", "a")).propose(TEXT[:20], 4)[0] == TEXT[20:24]
    assert corpus.get(("salt", "b")) is None
    assert corpus.get(UNSALTED) is None  # unsalted shares only with unsalted
    corpus.add(None, TEXT)  # unknown scope: stored nowhere
    assert corpus.tokens_by_scope() == {("salt", "a"): len(TEXT)}


def test_one_budget_evicts_the_oldest_request_of_any_scope():
    corpus = _corpus(max_tokens=150)
    corpus.add(("salt", "a"), TEXT)
    corpus.add(("salt", "b"), [t + 1000 for t in TEXT])
    corpus.add(("salt", "a"), [t + 2000 for t in TEXT])  # 180 > 150: the first one goes
    assert corpus.tokens_by_scope() == {("salt", "b"): 60, ("salt", "a"): 60}
    assert len(corpus) == 120
    assert corpus.get(("salt", "a")).propose(TEXT[:20], 4) == ([], 0)


def test_scoped_store_keeps_the_most_recent_scopes():
    store: ScopedStore[list] = ScopedStore(list, max_scopes=2)
    store.get("a").append(1)
    store.get("b")
    store.get("a")  # a is now the most recent
    store.get("c")  # b dropped
    assert store.peek("b") is None and store.get("a") == [1]
    assert store.get(None) == [] and len(store) == 2  # None is never kept


def test_one_scopes_acceptance_never_moves_anothers_prior():
    c = AdaptiveK(AdaptiveConfig(k_max=4, prior_alpha=0.6))
    c.join("a1", ("salt", "a"))
    c.join("b1", ("salt", "b"))
    for _ in range(50):
        c.begin_step()
        c.observe_round("a1", 4, 4)  # tenant a replays: everything accepted
    assert c.global_alpha(("salt", "a")) > 0.9
    assert c.global_alpha(("salt", "b")) == pytest.approx(0.6)
    assert c.alpha("b1") == pytest.approx(0.6)
    c.join("b2", ("salt", "b"))
    assert c.alpha("b2") == pytest.approx(0.6)
    c.join("u", None)  # unknown scope: pools with no one
    c.observe_round("u", 4, 0)
    assert c.global_alpha(None) == pytest.approx(0.6)


def test_scope_option_is_validated_and_off_means_no_corpus():
    with pytest.raises(SpecDecConfigError, match="ngram_corpus_scope.*Fix"):
        SpecDecConfig(method="ngram", ngram_corpus_scope="tenant")
    planner = Planner(SpecDecConfig(method="ngram", ngram_corpus_scope="off"), 1024, None,
                      lambda reason: None)
    assert planner.corpus is None
    assert Planner(SpecDecConfig(method="ngram"), 1024, None, lambda r: None).corpus is not None
