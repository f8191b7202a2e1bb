"""The planner's n-gram lookup: own history vs the cross-request corpus (no vLLM)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_specdec_plugin.config import SpecDecConfig
from vllm_specdec_plugin.planning import Planner
from vllm_specdec_plugin.request_state import RequestState

pytestmark = pytest.mark.unit


def _planner(k: int) -> Planner:
    config = SpecDecConfig(num_speculative_tokens=k, method="ngram", ngram_corpus_tokens=4096)
    return Planner(config, max_model_len=1024, allocator=None, no_draft=lambda reason: None)


def _drafts(planner: Planner, context: list[int], k: int) -> list[int]:
    row = np.asarray(context, dtype=np.int64)
    return planner._ngram_drafts(RequestState(), row, len(context), k)


def test_a_replay_of_periodic_output_drafts_its_own_history_run_past_the_corpus_end():
    """A finished request's output repeats with period 5, so the newest corpus occurrence
    of the replay's context is at the end of that sequence: 1 token left. The replay's
    own history proposes the same token and then more of the period: that run is taken."""
    prompt = list(range(100, 140))
    period = [7, 8, 9, 10, 11]
    finished = prompt + period * 12
    planner = _planner(k=8)
    planner.corpus.add(finished)
    replay = prompt + period * 6 + period[:4]     # mid-output, aligned with the period
    corpus_drafts, n = planner.corpus.propose(replay, 8)
    assert len(corpus_drafts) < 8 and n > 4       # the corpus match is long but short of tokens
    assert _drafts(planner, replay, 8) == (period * 3)[4:12]


def test_the_corpus_run_wins_where_own_history_disagrees_or_offers_no_more():
    """A replay of a non-periodic output: the corpus continuation (aligned, full length)
    is taken, as before; own history matches only a shorter context there."""
    rng = np.random.default_rng(0)
    finished = rng.integers(0, 1000, size=200).tolist()
    planner = _planner(k=6)
    planner.corpus.add(finished)
    replay = finished[:120]
    assert _drafts(planner, replay, 6) == finished[120:126]
