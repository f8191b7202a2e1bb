"""N-gram (prompt lookup) proposer: pinned semantics, index == brute-force reference, speed;
the cross-request corpus index."""

from __future__ import annotations

import copy
import random
import time

import numpy as np
import pytest

from specdec_testing.ngram_reference import propose_reference
from vllm_specdec_plugin.ngram import NGramConfig, NGramIndex
from vllm_specdec_plugin.ngram_corpus import CorpusIndex
from vllm_specdec_plugin.tuning import NGRAM_PRIOR

pytestmark = pytest.mark.unit


def both(history, k, max_n=4, min_n=1, window=1024, min_prob=0.0):
    """Propose with the index and the reference; they must agree. Returns the draft.
    min_prob 0 by default: the selection rules alone (truncation has its own tests)."""
    idx = NGramIndex(NGramConfig(max_n, min_n, window, min_prob), history)
    got = idx.propose(k)
    ref = propose_reference(history, k, max_n, min_n, window, min_prob)
    assert got == ref, (history, k, max_n, min_n, window, min_prob)
    return got


def test_repetitive_text_chains_through_virtual_tokens():
    # [1,2,3] matches at 0 -> 4; then [2,3,4] (virtual 4) matches at 1 -> 1; then
    # [3,4,1] -> 2. Copying the tokens after the first match would give the same here,
    # so also check a case where only chaining continues past the end of history.
    assert both([1, 2, 3, 4, 1, 2, 3], 3) == [4, 1, 2]
    # [5,6] -> draft 5, 6, 5, 6, ...: continues the period beyond the 3 real tokens.
    assert both([5, 6, 5, 6], 6) == [5, 6, 5, 6, 5, 6]


def test_most_recent_occurrence_wins_a_tie():
    # "7 8" was followed by 1 and later by 2, once each; the later one wins.
    assert both([7, 8, 1, 7, 8, 2, 7, 8], 1) == [2]
    # "8" -> 5, 5, 3, 3, 9: the most recent follower (9) is not among the tied: the
    # smallest id of those.
    assert both([8, 5, 8, 5, 8, 3, 8, 3, 8, 9, 8], 1, max_n=1) == [3]


def test_most_frequent_follower_wins():
    # "7 8" was followed by 1 twice, by 2 once (most recently): 1 wins.
    assert both([7, 8, 1, 7, 8, 1, 7, 8, 2, 7, 8], 1) == [1]
    # ... but a longer match still comes first, however rare: [3, 7, 8] -> 2.
    assert both([7, 8, 1, 7, 8, 1, 3, 7, 8, 2, 3, 7, 8], 1, max_n=3) == [2]


def test_chain_stops_before_an_uncertain_token():
    # "1" was followed by 2, 3 and 4 once each (the most recent: 4); "4" by 0 once; "0"
    # by 1 twice and 9 once. Confidence: count / (occurrences + NGRAM_PRIOR), so
    # 1/(3+β), 1/(1+β) (seen once: likely, not certain), 2/(3+β); the chain's product
    # after each token: a > b > c.
    hist = [1, 2, 0, 1, 3, 0, 1, 4, 0, 9, 1]
    a = 1 / (3 + NGRAM_PRIOR)
    b = a / (1 + NGRAM_PRIOR)
    c = b * 2 / (3 + NGRAM_PRIOR)
    assert both(hist, 3, max_n=1) == [4, 0, 1]
    assert both(hist, 3, max_n=1, min_prob=c * 0.999) == [4, 0, 1]  # float rounding
    assert both(hist, 3, max_n=1, min_prob=(b + c) / 2) == [4, 0]
    assert both(hist, 3, max_n=1, min_prob=(a + b) / 2) == [4]
    assert both(hist, 3, max_n=1, min_prob=a * 1.01) == []
    assert NGramIndex(history=hist).propose(3) == propose_reference(hist, 3)  # the default


def test_counts_follow_the_window_and_the_drafts():
    # Old occurrences of "1 -> 2" leave the window; the newer "1 -> 3" then wins.
    hist = [1, 2, 1, 2, 1, 2] + [0] * 6 + [1, 3, 0, 1]
    assert both(hist, 1, max_n=1) == [2]
    assert both(hist, 1, max_n=1, window=9) == [3]
    idx = NGramIndex(NGramConfig(1, 1, 9, 0.0))
    for t in hist:   # token by token: counted out as the window moves
        idx.extend([t])
    assert idx.propose(1) == [3] and (1,) not in idx._follow[0]  # once in the window


def test_longer_match_beats_more_recent_shorter():
    # Suffix [1,2,3]: the 3-gram occurs at 0 (-> 4); the 1-gram [3] is more recent at 6
    # (-> 5) and the 2-gram [2,3] is not elsewhere. Longest wins: 4.
    assert both([1, 2, 3, 4, 9, 9, 3, 5, 1, 2, 3], 1, max_n=3) == [4]
    # With max_n=1 only the 1-gram is tried, so the recent one wins.
    assert both([1, 2, 3, 4, 9, 9, 3, 5, 1, 2, 3], 1, max_n=1) == [5]


def test_no_match_and_min_n():
    assert both([1, 2, 3, 4, 5], 4) == []
    assert both([], 4) == []
    assert both([1], 4) == []
    # Only a 1-gram match exists; min_n=2 refuses it.
    assert both([3, 1, 2, 3], 2, min_n=1) != []
    assert both([3, 1, 2, 3], 2, min_n=2) == []


def test_chain_fills_k_once_started():
    # Once step 0 matches n-gram g at p, the next suffix (ending in the draft token)
    # occurs at p+1 with a known follower, so without truncation (min_prob 0) a chain
    # that starts never breaks: the draft is [] or exactly k tokens.
    assert both([1, 2, 3, 9, 1, 2], 8) == [3, 9, 1, 2, 3, 9, 1, 2]
    assert both([4, 1, 2, 5, 1, 2], 3, min_n=2) == [5, 1, 2]


def test_window_excludes_old_matches():
    hist = [1, 2, 3, 4] + [0] * 20 + [9, 1, 2, 3]
    assert both(hist, 1, window=1024) == [4]
    # Window of 10: the occurrence at position 0 is outside; [3], [2,3]... only at 0.
    assert both(hist, 1, window=10) == []
    # Within the window, a shorter match still works.
    hist2 = [1, 2, 3, 4] + [0] * 20 + [3, 7, 9, 1, 2, 3]
    assert both(hist2, 1, window=10) == [7]


def test_k_zero_and_negative():
    assert both([1, 2, 1, 2], 0) == []
    with pytest.raises(ValueError, match="k"):
        NGramIndex(history=[1, 2]).propose(-1)


def test_config_validation_names_the_fix():
    with pytest.raises(ValueError, match="max_n must be >= min_n >= 1"):
        NGramConfig(max_n=2, min_n=3)
    with pytest.raises(ValueError, match="max_n must be >= min_n >= 1"):
        NGramConfig(max_n=2, min_n=0)
    with pytest.raises(ValueError, match="window must be > max_n"):
        NGramConfig(max_n=4, window=4)
    with pytest.raises(ValueError, match="min_prob"):
        NGramConfig(min_prob=1.5)
    NGramConfig(max_n=4, min_n=4, window=5)


def test_numpy_history_and_python_ints():
    arr = np.array([1, 2, 3, 4, 1, 2, 3], dtype=np.int32)
    idx = NGramIndex(history=arr)
    out = idx.propose(3)
    assert out == [4, 1, 2] and all(type(t) is int for t in out)
    assert propose_reference(arr, 3) == [4, 1, 2]
    with pytest.raises(ValueError, match="1-D"):
        NGramIndex(history=arr.reshape(1, -1))


def test_propose_does_not_mutate_and_extend_matches_rebuild():
    idx = NGramIndex(history=[1, 2, 3, 1, 2, 3, 1])
    before = (list(idx.tokens), copy.deepcopy(idx._maps))
    first = idx.propose(8)
    assert idx.propose(8) == first
    assert (list(idx.tokens), idx._maps) == before
    idx.extend([2, 3])
    assert idx.propose(5) == NGramIndex(history=[1, 2, 3, 1, 2, 3, 1, 2, 3]).propose(5)
    assert len(idx) == 9


def test_index_equals_reference_randomized():
    rng = random.Random(1234)
    cases = 0
    for _ in range(3000):
        vocab = rng.randint(1, 6)  # small vocabularies -> frequent, conflicting matches
        min_n = rng.randint(1, 3)
        max_n = rng.randint(min_n, 5)
        window = rng.randint(max_n + 1, 40)
        min_prob = rng.choice([0.0, 0.0, 0.1, 0.3, 0.6])
        length = rng.randint(0, 80)  # often longer than the window
        hist = [rng.randrange(vocab) for _ in range(length)]
        cfg = NGramConfig(max_n, min_n, window, min_prob)
        idx = NGramIndex(cfg)
        pos = 0
        while True:  # incremental extend in random chunk sizes, checked after each
            k = rng.randint(0, 8)
            got = idx.propose(k)
            assert got == propose_reference(hist[:pos], k, max_n, min_n, window, min_prob), (
                hist[:pos], k, max_n, min_n, window, min_prob)
            assert len(got) in (0, k) or min_prob > 0
            cases += 1
            if pos >= length:
                break
            step = rng.randint(1, 8) if rng.random() < 0.6 else rng.randint(9, 40)  # both paths
            idx.extend(np.array(hist[pos:pos + step]) if rng.random() < 0.3 else hist[pos:pos + step])
            pos = min(length, pos + step)
    assert cases >= 3000


def test_performance_sanity():
    rng = np.random.default_rng(0)
    cfg = NGramConfig(max_n=4, min_n=1, window=1024)
    hists = []
    for _ in range(256):
        # Repetitive-ish text: random spans copied from earlier, so matches are common.
        h = list(rng.integers(0, 500, 50))
        while len(h) < 2000:
            if rng.random() < 0.5:
                s = int(rng.integers(0, len(h) - 10))
                h.extend(h[s:s + int(rng.integers(3, 30))])
            else:
                h.extend(rng.integers(0, 500, 5).tolist())
        hists.append(np.array(h[:2000]))
    t0 = time.perf_counter()
    indices = [NGramIndex(cfg, h) for h in hists]
    t1 = time.perf_counter()
    drafts = [idx.propose(8) for idx in indices]
    t2 = time.perf_counter()
    print(f"ngram: build 256x2000 tokens {t1 - t0:.3f} s; propose(k=8) x256 {t2 - t1:.4f} s; "
          f"mean draft len {sum(map(len, drafts)) / len(drafts):.2f}")
    assert t2 - t1 < 2.0


# -- longest_match ------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_longest_match_is_the_n_propose_starts_from(seed):
    rng = random.Random(seed)
    for _ in range(200):
        hist = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        cfg = NGramConfig(4, 1, rng.choice([5, 8, 1024]), 0.0)  # min_prob 0: a match drafts
        n = NGramIndex(cfg, hist).longest_match()
        # brute force: the longest suffix (<= max_n) with an earlier start in the window
        m, want = len(hist), 0
        for size in range(min(4, m - 1), 0, -1):
            if any(hist[p:p + size] == hist[m - size:] for p in range(max(0, m - cfg.window), m - size)):
                want = size
                break
        assert n == want, (hist, cfg)
        assert (n > 0) == bool(NGramIndex(cfg, hist).propose(1))


# -- CorpusIndex ----------------------------------------------------------------------

def test_corpus_continues_a_finished_request():
    c = CorpusIndex(max_tokens=100, max_n=4, min_n=3)
    c.add([1, 2, 3, 4, 5, 6, 7, 8])
    assert len(c) == 8
    assert c.propose([9, 2, 3, 4], 3) == ([5, 6, 7], 3)  # longest suffix found: [2, 3, 4]
    assert c.propose([1, 2, 3, 4], 3) == ([5, 6, 7], 4)
    assert c.propose([5, 6, 7], 5) == ([8], 3)  # never past the sequence's end
    assert c.propose([7, 8], 2) == ([], 0)  # shorter than min_n
    assert c.propose([3, 4, 9], 2) == ([], 0)
    assert c.propose([1, 2, 3], 0) == ([], 3)
    with pytest.raises(ValueError):
        c.propose([1, 2, 3], -1)


def test_corpus_match_length_extends_back_over_the_agreeing_context():
    c = CorpusIndex(max_tokens=100, max_n=4, min_n=3)
    c.add([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert c.propose([0, 3, 4, 5, 6, 7], 2) == ([8, 9], 5)  # [3..7] agree, 2 != 0 stops it
    assert c.propose([1, 2, 3, 4, 5, 6, 7], 2) == ([8, 9], 7)  # back to the sequence start
    c = CorpusIndex(max_tokens=1000, max_n=4, min_n=3)
    replay = list(range(1000, 1200))
    c.add(replay)
    assert c.propose(replay[:150], 3) == (replay[150:153], CorpusIndex.MAX_EXTEND)
    # a newer sequence shares the replay's last 4 tokens but not the 16 before them:
    # the long key still finds the replay's own position
    c.add([7] * 20 + replay[146:150] + [1, 2, 3])
    assert c.propose(replay[:150], 3) == (replay[150:153], CorpusIndex.MAX_EXTEND)
    assert c.propose([5] * 16 + replay[146:150], 3) == ([1, 2, 3], 4)


def test_corpus_newest_sequence_wins_and_eviction_keeps_it_bounded():
    c = CorpusIndex(max_tokens=12, max_n=3, min_n=2)
    c.add([1, 2, 3, 10])
    c.add([1, 2, 3, 20, 21])
    assert c.propose([1, 2, 3], 1) == ([20], 3)
    c.add([7, 7, 7, 7, 7])  # 14 tokens > 12: the oldest sequence goes
    assert len(c) == 10
    assert c.propose([1, 2, 3], 1) == ([20], 3)  # the newer one's entries stay
    c.add([8, 8, 8, 8, 8, 8])  # evicts [1, 2, 3, 20, 21]
    assert c.propose([1, 2, 3], 1) == ([], 0)
    assert all(sid in c._seqs for m in c._maps for sid, _ in m.values())  # no stale entry
    c.add(list(range(100, 150)))  # longer than max_tokens: its tail is kept
    assert len(c) == 12 and c.propose([140, 141, 142], 2) == ([143, 144], 3)
    c.add([5])  # too short to index: ignored
    assert len(c) == 12


def test_corpus_most_frequent_follower_and_truncation():
    c = CorpusIndex(max_tokens=100, max_n=3, min_n=2, min_prob=0.0)
    for tail in ([10, 11], [10, 11], [20, 21]):
        c.add([1, 2, 3] + tail)
    assert c.propose([1, 2, 3], 2) == ([10, 11], 3)  # 2 of 3 sequences, newest had 20
    c = CorpusIndex(max_tokens=100, max_n=3, min_n=2, min_prob=0.5)
    for tail in ([10, 11], [20, 21], [30, 31]):
        c.add([1, 2, 3] + tail)
    assert c.propose([1, 2, 3], 2) == ([], 3)  # 1/(3+β) each: below 0.5, nothing drafted
    first = 1 / (3 + NGRAM_PRIOR)  # a tie: the newest, 30; then 31, seen once: 1/(1+β)
    c.min_prob = first / (1 + NGRAM_PRIOR)
    assert c.propose([1, 2, 3], 2) == ([30, 31], 3)
    c.min_prob = first
    assert c.propose([1, 2, 3], 2) == ([30], 3)


def test_corpus_drafts_no_more_tokens_than_the_match_is_long():
    # As suffix decoding's max_spec_factor 1: a short match says little about a long run.
    c = CorpusIndex(max_tokens=100, max_n=3, min_n=1, min_prob=0.0)
    c.add([5, 6, 7, 8, 9])
    assert c.propose([9, 5], 4) == ([6], 1)          # "5": one token
    assert c.propose([4, 5, 6], 4) == ([7, 8], 2)    # "5 6": two
    assert c.propose([5, 6, 7], 4) == ([8, 9], 3)    # "5 6 7": three, and the sequence ends


def test_corpus_memory_stays_bounded_under_traffic():
    rng = random.Random(0)
    c = CorpusIndex(max_tokens=500, max_n=4, min_n=3)
    for _ in range(300):
        c.add([rng.randrange(50) for _ in range(rng.randrange(5, 80))])
        assert len(c) <= 500
    entries = sum(len(m) for m in c._maps)
    assert entries <= 3 * 500  # at most one entry per (key length, position) held
    assert all(sid in c._seqs for m in c._maps for sid, _ in m.values())
    # the follower counts are those of the sequences held, nothing left by evictions
    # (kept for n-grams held twice or more; once, the last-start entry says it)
    for j, n in enumerate(c._ns):
        want = {}
        for toks in c._seqs.values():
            for p in range(len(toks) - n):
                f = want.setdefault(tuple(toks[p:p + n]), {})
                f[toks[p + n]] = f.get(toks[p + n], 0) + 1
        assert set(c._maps[j]) == set(want)
        assert all(want[key] == f for key, f in c._follow[j].items())
        assert all(key in c._follow[j] for key, f in want.items() if sum(f.values()) > 1)


def test_corpus_validation():
    for kwargs in ({"max_tokens": 4, "max_n": 4}, {"max_tokens": 100, "max_n": 2, "min_n": 3},
                   {"max_tokens": 100, "min_n": 0}):
        with pytest.raises(ValueError):
            CorpusIndex(**kwargs)
