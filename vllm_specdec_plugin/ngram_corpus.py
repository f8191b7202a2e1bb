"""Cross-request n-gram index over finished requests' histories (pure Python + numpy):
traffic that repeats earlier prompts or outputs drafts their continuation, as suffix
decoding does. Rules: ``ngram``'s; who shares one index: ``tenancy``.
"""

from __future__ import annotations

from itertools import count
from typing import Iterable, Sequence

import numpy as np

from vllm_specdec_plugin.ngram import (Followers, as_int_list, check_k, check_prob, choose,
                                       count_in, count_out, ngram_keys)
from vllm_specdec_plugin.tuning import NGRAM_MAX_N, NGRAM_MIN_PROB

__all__ = ["CorpusIndex"]


class CorpusIndex:
    """``add`` stores a finished request's tokens; ``propose`` looks up a live context's
    last ``n`` tokens for ``n = MIN_LONG_N, max_n .. min_n`` (longest first) and drafts
    the n-gram's most frequent follower over the stored sequences (ties: the most recent
    occurrence's, else the smallest id), chained as ``ngram`` does (no prior for a
    replay's ``MIN_LONG_N`` key), for at most as many tokens as the match is long (as
    suffix decoding's ``max_spec_factor`` 1). At most ``max_tokens`` tokens are held,
    the oldest sequences evicted first with their entries and counts. ``add``: O(max_n)
    dict updates per token; ``propose``: O(k * max_n) lookups, <= ``MAX_EXTEND``
    comparisons.
    """

    MAX_EXTEND = 64  # tokens: how far back a match's length is measured
    MIN_LONG_N = 16  # tokens: the key length that finds a replay's own earlier position

    def __init__(self, max_tokens: int, max_n: int = NGRAM_MAX_N, min_n: int = 3,
                 min_prob: float = NGRAM_MIN_PROB) -> None:
        if not (max_n >= min_n >= 1) or max_tokens <= max_n:
            raise ValueError(f"CorpusIndex needs max_n >= min_n >= 1 and max_tokens > max_n; "
                             f"got max_n={max_n}, min_n={min_n}, max_tokens={max_tokens}")
        check_prob(min_prob)
        self.max_tokens, self.max_n, self.min_n = max_tokens, max_n, min_n
        self.min_prob = min_prob
        self._seqs: dict[int, list[int]] = {}  # id -> tokens, insertion order = age
        self._next_id = 0
        self._total = 0
        # Key lengths, longest first: a long key places a replayed context at its own
        # earlier occurrence, where a short n-gram's latest may be a common phrase.
        self._ns = ([self.MIN_LONG_N] if self.MIN_LONG_N > max_n else []) + \
            list(range(max_n, min_n - 1, -1))
        # _maps[i]: n-gram of length _ns[i] -> (sequence id, start), most recent occurrence
        self._maps: list[dict[tuple[int, ...], tuple[int, int]]] = [{} for _ in self._ns]
        # _follow[i]: n-gram of length _ns[i] -> {follower: occurrences in stored
        # sequences}, for n-grams stored at least twice (once: the _maps entry says it)
        self._follow: list[dict[tuple[int, ...], Followers]] = [{} for _ in self._ns]

    def __len__(self) -> int:  # tokens held
        return self._total

    def add(self, tokens: Sequence[int] | np.ndarray | Iterable[int]) -> int:
        """Store one finished request's history (1-D token ids; only the last
        ``max_tokens`` of a longer one are kept). Returns the tokens stored (0: none)."""
        toks = as_int_list(tokens)[-self.max_tokens:]
        if len(toks) <= self.min_n:
            return 0  # no n-gram with a follower
        sid, self._next_id = self._next_id, self._next_id + 1
        self._seqs[sid] = toks
        self._total += len(toks)
        seqs = self._seqs
        for n, d, f in zip(self._ns, self._maps, self._follow):
            get = d.get
            for p, key, tok in zip(count(), ngram_keys(toks, 0, len(toks) - n, n), toks[n:]):
                prev = get(key)
                d[key] = (sid, p)  # the newest sequence wins (its latest occurrence)
                if prev is not None:
                    count_in(f, key, tok, seqs[prev[0]][prev[1] + n])
        while self._total > self.max_tokens:
            self.evict_oldest()
        return len(toks)

    def evict_oldest(self) -> None:
        """Drop the oldest stored sequence and its index entries and counts."""
        sid = next(iter(self._seqs))
        toks = self._seqs.pop(sid)
        self._total -= len(toks)
        for j, n in enumerate(self._ns):
            d, f = self._maps[j], self._follow[j]
            keys = ngram_keys(toks, 0, len(toks) - n, n)  # those with a known follower
            count_out(f, keys, toks[n:])
            for key in keys:
                hit = d.get(key)
                if hit is not None and hit[0] == sid:  # newer sequences keep their entries
                    del d[key]

    def _lookup(self, ctx: list[int]) -> tuple[int, int, int, tuple[int, ...]] | None:
        """(key index, sequence id, start, key) of the longest stored suffix of ``ctx``."""
        m = len(ctx)
        for j, (n, d) in enumerate(zip(self._ns, self._maps)):
            if n > m:
                continue
            key = tuple(ctx[m - n:])
            hit = d.get(key)
            if hit is not None:
                return j, hit[0], hit[1], key
        return None

    def propose(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """(up to ``min(k, match length)`` drafts continuing ``context`` (Python ints), the
        match length); ([], 0) without a match of ``min_n`` tokens. The match length
        extends backwards from the first lookup's occurrence while that sequence and the
        context agree (up to ``MAX_EXTEND``): a replay reports a long match, a common
        phrase a short one."""
        check_k(k)
        m = len(context)
        ctx = list(context[m - min(m, self._ns[0]):])
        first = self._lookup(ctx)
        if first is None:
            return [], 0
        j, sid, s, _ = first
        n, seq = self._ns[j], self._seqs[sid]
        length, limit = n, min(m, s + n, self.MAX_EXTEND)
        while length < limit and seq[s + n - length - 1] == context[m - length - 1]:
            length += 1
        draft: list[int] = []
        conf, hit, k = 1.0, first, min(k, length)
        while len(draft) < k and hit is not None:
            j, sid, s, key = hit
            recent = self._seqs[sid][s + self._ns[j]]
            # A 16-token context seen once is a replay's own earlier position: as good
            # as certain (no prior), as on a suffix tree's deep path.
            tok, p = choose(self._follow[j].get(key) or {recent: 1}, recent,
                            0.0 if self._ns[j] >= self.MIN_LONG_N else None)
            if conf * p < self.min_prob:
                break
            conf *= p
            draft.append(tok)
            ctx.append(tok)
            hit = self._lookup(ctx[-self._ns[0]:])
        return draft, length
