"""Draft-free n-gram ("prompt lookup") drafts over one request's own history (prompt +
output): pure Python + numpy. ``ngram_corpus`` applies the same rules to finished
requests. Up to ``k`` drafts, by these rules (``NGramIndex``; the tests hold it to a
brute-force specification, ``specdec_testing/ngram_reference.py``):

* History of length ``L``; context ``c`` = history + the drafts so far, length ``m``.
  The suffix of length ``n`` is ``c[m-n:m]``, tried for ``n = max_n .. min_n`` (longest
  match first, even if a shorter one is more frequent or more recent).
* Occurrences of the suffix are the start positions ``p`` with ``c[p:p+n] == suffix``
  and ``max(0, L - window) <= p <= m - n - 1``: the n-gram starts inside the last
  ``window`` tokens of the history, and its following token ``c[p+n]`` is known (so
  the suffix itself never counts; a follower may be an earlier draft).
* The draft token is the most frequent follower over those occurrences; on a tie in
  count, the follower of the most recent occurrence if it is among the tied, else the
  smallest id. Its confidence is its count / (the number of occurrences +
  ``NGRAM_PRIOR``): a frequency estimate, as suffix decoding's tree counts are, that
  does not take a context seen once for a certainty.
* Chaining: the draft token is appended to the context and the lookup repeats. It
  stops at ``k`` tokens, at the first step with no match for any ``n >= min_n``, or
  before a token that would bring the product of the chain's confidences below
  ``min_prob`` (``tuning.NGRAM_MIN_PROB``): a run of likely tokens is drafted, an
  uncertain tail is not (verifying it costs the step more than it returns).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Iterable, Sequence

import numpy as np

from vllm_specdec_plugin.tuning import (NGRAM_MAX_N, NGRAM_MIN_N, NGRAM_MIN_PROB, NGRAM_PRIOR,
                                        NGRAM_WINDOW)

__all__ = ["NGramConfig", "NGramIndex"]

Followers = dict[int, int]  # following token -> occurrences


@dataclass(frozen=True, slots=True)
class NGramConfig:
    """Matching parameters (lengths in tokens; the module's rules)."""

    max_n: int = NGRAM_MAX_N        # longest suffix tried first
    min_n: int = NGRAM_MIN_N        # shortest suffix accepted
    window: int = NGRAM_WINDOW      # n-grams must start in the history's last ``window`` tokens
    min_prob: float = NGRAM_MIN_PROB  # the chain's least confidence product (0: no limit)

    def __post_init__(self) -> None:
        if not (self.max_n >= self.min_n >= 1):
            raise ValueError(
                f"ngram max_n must be >= min_n >= 1; got max_n={self.max_n}, min_n={self.min_n}")
        if self.window <= self.max_n:  # an n-gram and its follower must fit
            raise ValueError(
                f"ngram window must be > max_n (set window >= {self.max_n + 1} or lower "
                f"max_n); got window={self.window}, max_n={self.max_n}")
        check_prob(self.min_prob)


def check_prob(min_prob: float) -> None:
    if not 0.0 <= min_prob <= 1.0:
        raise ValueError(f"ngram min_prob must be in [0, 1]; got {min_prob!r}")


def as_int_list(tokens: Sequence[int] | np.ndarray | Iterable[int]) -> list[int]:
    """1-D int array / sequence -> list of Python ints (hashable, fast to slice)."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise ValueError(f"token history must be 1-D; got shape {tokens.shape}")
        return tokens.astype(np.int64, copy=False).tolist()
    return [int(t) for t in tokens]


def check_k(k: int) -> None:
    if k < 0:
        raise ValueError(f"ngram k (number of draft tokens) must be >= 0; got k={k}")


def choose(followers: Followers, recent: int, prior: float | None = None) -> tuple[int, float]:
    """(draft token, confidence) from a key's follower counts (all > 0) and the
    follower of its most recent occurrence (module rule); ``prior``: the confidence's
    prior count (None: ``NGRAM_PRIOR``)."""
    best = max(followers.values())
    tok = recent if followers.get(recent) == best else \
        min(t for t, c in followers.items() if c == best)
    return tok, best / (sum(followers.values()) + (NGRAM_PRIOR if prior is None else prior))


def count_in(table: dict[tuple[int, ...], Followers], key: tuple[int, ...], tok: int,
         prev_tok: int | None) -> None:
    """Count one more occurrence of ``key`` followed by ``tok``, only for n-grams seen at
    least twice: ``prev_tok`` is the follower of the key's one uncounted occurrence (its
    last start) when the key has no entry yet; None for a first occurrence."""
    f = table.get(key)
    if f is not None:
        f[tok] = f.get(tok, 0) + 1
    elif prev_tok is not None:
        table[key] = {tok: 2} if prev_tok == tok else {prev_tok: 1, tok: 1}


def count_out(table: dict[tuple[int, ...], Followers], keys: Iterable[tuple[int, ...]],
               followers: Iterable[int]) -> None:
    """One occurrence less of each (key, follower); an n-gram without an entry had one."""
    for key, tok in zip(keys, followers):
        f = table.get(key)
        if f is None:
            continue
        c = f[tok] - 1
        if c:
            f[tok] = c
        else:
            del f[tok]
            if not f:
                del table[key]


def ngram_keys(toks: list[int], lo: int, hi: int, n: int) -> list[tuple[int, ...]]:
    """The n-grams starting at ``lo .. hi - 1``, none if ``hi <= lo`` (C-speed zip for
    a prompt's many)."""
    if hi - lo > 8:
        return list(zip(*(toks[lo + i:hi + i] for i in range(n))))
    return [tuple(toks[s:s + n]) for s in range(lo, hi)]


class NGramIndex:
    """Incremental n-gram index of one request's token history.

    Per ``n`` in ``[min_n, max_n]``, over n-grams whose follower is known: n-gram -> last
    start, and n-gram -> {follower: count} over the starts inside the window (counted
    out as they leave it), the latter only for n-grams seen there twice or more (once:
    the last start says it). ``extend``: O(max_n) dict updates per token; ``propose``:
    O(k * (max_n - min_n + 1)) lookups plus the matched n-grams' followers, whatever the
    history length and window.
    """

    def __init__(
        self,
        config: NGramConfig | None = None,
        history: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        self.config = config or NGramConfig()
        self._tokens: list[int] = []
        n_sizes = self.config.max_n - self.config.min_n + 1
        # _maps[n - min_n] / _follow[n - min_n]: the dicts for n-grams of length n.
        self._maps: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_sizes)]
        self._follow: list[dict[tuple[int, ...], Followers]] = [{} for _ in range(n_sizes)]
        self._cut = 0  # starts below this are outside the window (not counted)
        if history is not None:
            self.extend(history)

    def __len__(self) -> int:  # real (non-draft) tokens indexed
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:  # the indexed history (do not mutate; use ``extend``)
        return self._tokens

    def extend(self, tokens: Sequence[int] | np.ndarray | Iterable[int]) -> None:
        """Append committed tokens ([T]) to the history and index them."""
        toks, new = self._tokens, as_int_list(tokens)
        if not new:
            return
        old = len(toks)
        toks.extend(new)
        # Starts below ``cut`` are outside the window: counted out, or never counted in.
        # _maps keeps them: a last start before the window means all are before it.
        cut = max(self._cut, len(toks) - self.config.window)
        for n, d, f in zip(count(self.config.min_n), self._maps, self._follow):
            # starts [lo, hi) get their follower now; [self._cut, lo) had one before
            lo, hi = max(0, old - n), len(toks) - n
            end = min(cut, lo)
            if end > self._cut:  # first: a start leaving now is no longer "in the window"
                count_out(f, ngram_keys(toks, self._cut, end, n), toks[self._cut + n:end + n])
            if hi > lo:
                get = d.get
                for p, key, tok in zip(range(lo, hi), ngram_keys(toks, lo, hi, n),
                                       toks[lo + n:hi + n]):
                    prev = get(key)
                    d[key] = p  # in order: the most recent wins
                    if p >= cut:
                        count_in(f, key, tok, toks[prev + n] if prev is not None and prev >= cut
                             else None)
        self._cut = cut

    def longest_match(self) -> int:
        """n of the match ``propose`` would start from (0: none)."""
        cfg, toks = self.config, self._tokens
        m = len(toks)
        for n in range(min(cfg.max_n, m - 1), cfg.min_n - 1, -1):
            p = self._maps[n - cfg.min_n].get(tuple(toks[m - n:]))
            if p is not None and p >= m - cfg.window:
                return n
        return 0

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` chained draft token ids, the index unchanged: draft tokens go into a
        per-call overlay (last start, follower counts) read on top of it (more recent;
        its counts add)."""
        check_k(k)
        cfg, toks, maps, follow = self.config, self._tokens, self._maps, self._follow
        min_n, max_n = cfg.min_n, cfg.max_n
        L = len(toks)
        lo = L - cfg.window
        # Only the last max_n real tokens can take part in a suffix or overlay n-gram.
        offset = max(0, L - max_n)
        ctx = toks[offset:]  # absolute position of ctx[x] is offset + x
        o_last: list[dict[tuple[int, ...], int]] = [{} for _ in maps]
        o_follow: list[dict[tuple[int, ...], Followers]] = [{} for _ in maps]
        draft: list[int] = []
        conf = 1.0
        while len(draft) < k:
            m = offset + len(ctx)
            pick = None
            for n in range(min(max_n, m - 1), min_n - 1, -1):
                key = tuple(ctx[len(ctx) - n:])
                j = n - min_n
                real = maps[j].get(key)
                if real is not None and real < lo:
                    real = None  # every real start is before the window
                p = o_last[j].get(key, real)
                if p is not None:
                    f = p + n  # position of the most recent occurrence's follower
                    recent = toks[f] if f < L else ctx[f - offset]
                    counts = follow[j].get(key)
                    if counts is None:  # no entry: at most one real occurrence
                        counts = {} if real is None else {toks[real + n]: 1}
                    extra = o_follow[j].get(key)
                    if extra:
                        counts = {**counts}
                        for t, c in extra.items():
                            counts[t] = counts.get(t, 0) + c
                    pick = choose(counts, recent)
                    break
            if pick is None or conf * pick[1] < cfg.min_prob:
                break
            conf *= pick[1]
            nxt = pick[0]
            draft.append(nxt)
            # nxt (at position m) now follows the n-grams ending at m-1.
            for j in range(len(maps)):
                s = m - (min_n + j)
                if s < 0:
                    break
                key = tuple(ctx[s - offset:m - offset])
                o_last[j][key] = s
                of = o_follow[j].setdefault(key, {})
                of[nxt] = of.get(nxt, 0) + 1
            ctx.append(nxt)
        return draft
