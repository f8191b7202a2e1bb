"""What requests share: corpus and learned acceptance per cache_salt scope (no vLLM)."""

from __future__ import annotations

import pytest

from vllm_specdec_plugin.config import SpecDecConfig
from vllm_specdec_plugin.errors import SpecDecConfigError
from vllm_specdec_plugin.ngram_corpus import CorpusIndex
from vllm_specdec_plugin.planning import Planner
from vllm_specdec_plugin.tenancy import (UNSALTED, RequestScopes, ScopedCorpus, ScopedStore,
                                         scope_key)

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


# One scope's acceptance never moving another's prior: test_acceptance.py.


def test_request_scopes_follow_the_engines_reports():
    scopes = RequestScopes("salt")
    assert scopes.note(({"a": "x", "b": None}, ())) is False
    assert scopes.get("a") == ("salt", "x") and scopes.get("b") == UNSALTED
    assert scopes.note(({}, ["b"])) is False  # b aborted: its tokens join no corpus
    assert scopes.finish("a") == (("salt", "x"), True)
    assert scopes.finish("b") == (UNSALTED, False)
    assert scopes.finish("never") == (None, True)
    assert RequestScopes("global").note(({"c": "x"}, ())) is False
    # a step without a report: nothing is shared from then on (warned once)
    assert scopes.note(({"d": "x"}, ())) is False and scopes.note(None) is True
    assert scopes.note(None) is False
    scopes.note(({"e": "x"}, ()))
    assert scopes.get("e") is None and scopes.finish("d") == (("salt", "x"), False)


def _planner(scope: str, tokens: int = 65536) -> Planner:
    return Planner("ngram", 8, 1024, tokens, scope, 2048, lambda reason: None)


def test_scope_option_is_validated_and_off_means_no_corpus():
    with pytest.raises(SpecDecConfigError, match="ngram_corpus_scope.*Fix"):
        SpecDecConfig(method="ngram", ngram_corpus_scope="tenant")
    assert _planner("off").corpus is None
    assert _planner("salt", tokens=0).corpus is None
    assert _planner("salt").corpus is not None and _planner("global").corpus is not None
    assert Planner("draft", 8, 1024, 65536, "salt", 2048, lambda r: None).corpus is None
