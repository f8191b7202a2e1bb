"""Draft-free n-gram ("prompt lookup") proposer core: pure Python + numpy, no vllm/torch.

Two indexes: :class:`NGramIndex` over one request's own history (below), and
:class:`CorpusIndex` over the histories of finished requests (cross-request, as
suffix decoding does: traffic that repeats earlier prompts or outputs drafts their
continuation).

Given one request's token history (prompt + generated tokens) it proposes up to ``k``
draft token ids. Semantics, shared by :class:`NGramIndex` and :func:`propose_reference`:

* Context ``c`` of length ``m``; suffix of length ``n`` is ``c[m-n:m]``, tried for
  ``n = max_n .. min_n`` (longest match first, even if a shorter one is more recent).
* A match is a start position ``p`` with ``c[p:p+n] == suffix`` and
  ``max(0, m - window) <= p <= m - n - 1``: the n-gram starts inside the last ``window``
  tokens, and its following token ``c[p+n]`` is already known (so the suffix itself never
  matches). The largest such ``p`` (most recent occurrence) wins; the draft token is
  ``c[p+n]``.
* Chaining: the draft token is appended to the (virtual) context, ``m`` grows by one
  (so the window slides with it), and the lookup repeats. It stops at ``k`` tokens or at
  the first step with no match for any ``n >= min_n``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count, repeat
from typing import Iterable, Sequence

import numpy as np

__all__ = ["CorpusIndex", "NGramConfig", "NGramIndex", "propose_reference"]


@dataclass(frozen=True, slots=True)
class NGramConfig:
    """Matching parameters. All lengths are in tokens."""

    max_n: int = 4
    """Longest suffix n-gram tried first."""
    min_n: int = 1
    """Shortest suffix n-gram accepted; below it the draft stops."""
    window: int = 1024
    """Only n-grams starting in the last ``window`` tokens of the context are matched."""

    def __post_init__(self) -> None:
        if not (self.max_n >= self.min_n >= 1):
            raise ValueError(
                f"ngram max_n must be >= min_n >= 1; got max_n={self.max_n}, min_n={self.min_n}"
            )
        # An n-gram plus its following token must fit, else max_n could never match.
        if self.window <= self.max_n:
            raise ValueError(
                f"ngram window must be > max_n (set window >= {self.max_n + 1} or lower "
                f"max_n); got window={self.window}, max_n={self.max_n}"
            )


def _as_int_list(tokens: Sequence[int] | np.ndarray | Iterable[int]) -> list[int]:
    """1-D int array / sequence -> list of Python ints (hashable, fast to slice)."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise ValueError(f"token history must be 1-D; got shape {tokens.shape}")
        return tokens.astype(np.int64, copy=False).tolist()
    return [int(t) for t in tokens]


def _check_k(k: int) -> None:
    if k < 0:
        raise ValueError(f"ngram k (number of draft tokens) must be >= 0; got k={k}")


def propose_reference(
    history: Sequence[int] | np.ndarray,
    k: int,
    max_n: int = 4,
    min_n: int = 1,
    window: int = 1024,
) -> list[int]:
    """Brute-force O(k * max_n * window * n) scan; the specification NGramIndex must match.

    ``history``: 1-D token ids, shape ``[L]``. Returns ``<= k`` draft token ids.
    """
    NGramConfig(max_n, min_n, window)
    _check_k(k)
    ctx = _as_int_list(history)
    draft: list[int] = []
    while len(draft) < k:
        m = len(ctx)
        lo = max(0, m - window)
        nxt = None
        for n in range(max_n, min_n - 1, -1):
            suffix = ctx[m - n:] if n <= m else None
            # Scan backwards so the first hit is the most recent occurrence.
            for p in range(m - n - 1, lo - 1, -1):
                if ctx[p:p + n] == suffix:
                    nxt = ctx[p + n]
                    break
            if nxt is not None:
                break
        if nxt is None:
            break
        draft.append(nxt)
        ctx.append(nxt)
    return draft


class NGramIndex:
    """Incremental n-gram index of one request's token history.

    For each ``n`` in ``[min_n, max_n]`` keeps a dict ``n-gram tuple -> last start
    position p`` among n-grams whose following token is known (``p + n < len``).
    ``extend`` costs O(max_n) dict updates per token; ``propose`` costs
    O(k * (max_n - min_n + 1)) dict lookups, independent of history length and window.
    Stale entries (start before the window) are not deleted: since only the most recent
    position is kept, ``p < m - window`` means every occurrence is outside the window.
    """

    def __init__(
        self,
        config: NGramConfig | None = None,
        history: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        self.config = config or NGramConfig()
        self._tokens: list[int] = []
        # _maps[n - min_n] is the dict for n-grams of length n.
        self._maps: list[dict[tuple[int, ...], int]] = [
            {} for _ in range(self.config.min_n, self.config.max_n + 1)
        ]
        if history is not None:
            self.extend(history)

    def __len__(self) -> int:
        """Number of real (non-draft) tokens indexed."""
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        """The indexed history (do not mutate; use ``extend``)."""
        return self._tokens

    def extend(self, tokens: Sequence[int] | np.ndarray | Iterable[int]) -> None:
        """Append accepted tokens (1-D, shape ``[T]``) to the history and index them."""
        toks, new = self._tokens, _as_int_list(tokens)
        min_n, maps = self.config.min_n, self._maps
        if len(new) > 8:  # a prompt: build each n's tuples at C speed
            old = len(toks)
            toks.extend(new)
            for n, d in enumerate(maps, start=min_n):
                # followers new: starts s in [old - n, len - n), s >= 0, in order, so
                # the most recent occurrence wins
                lo, hi = max(0, old - n), len(toks) - n
                if hi > lo:
                    d.update(zip(zip(*(toks[lo + i:hi + i] for i in range(n))), range(lo, hi)))
            return
        for t in new:  # a step's few tokens: zip's set-up would cost more
            i = len(toks)  # position of t; t is the follower of the n-grams ending at i-1
            for j, d in enumerate(maps):
                s = i - (min_n + j)
                if s < 0:
                    break  # larger n start even earlier
                d[tuple(toks[s:i])] = s  # overwrite: the most recent occurrence wins
            toks.append(t)

    def longest_match(self) -> int:
        """n of the match ``propose`` would start from (0: none): the longest suffix of
        the history that occurs earlier inside the window."""
        cfg, toks = self.config, self._tokens
        m = len(toks)
        for n in range(min(cfg.max_n, m - 1), cfg.min_n - 1, -1):
            p = self._maps[n - cfg.min_n].get(tuple(toks[m - n:]))
            if p is not None and p >= m - cfg.window:
                return n
        return 0

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` chained draft token ids; never mutates the index.

        Virtual (draft) tokens go into a small per-call overlay of n-gram dicts, checked
        before the real index because any overlay position is more recent.
        """
        _check_k(k)
        cfg, toks, maps = self.config, self._tokens, self._maps
        min_n, max_n = cfg.min_n, cfg.max_n
        L = len(toks)
        # Only the last max_n real tokens can take part in a suffix or overlay n-gram.
        offset = max(0, L - max_n)
        ctx = toks[offset:]  # absolute position of ctx[x] is offset + x
        overlay: list[dict[tuple[int, ...], int]] = [{} for _ in maps]
        draft: list[int] = []
        while len(draft) < k:
            m = offset + len(ctx)
            lo = m - cfg.window
            nxt = None
            for n in range(min(max_n, m - 1), min_n - 1, -1):
                key = tuple(ctx[len(ctx) - n:])
                p = overlay[n - min_n].get(key)
                if p is None:
                    p = maps[n - min_n].get(key)
                if p is not None and p >= lo:
                    f = p + n  # position of the following token
                    nxt = toks[f] if f < L else ctx[f - offset]
                    break
            if nxt is None:
                break
            draft.append(nxt)
            # nxt (at position m) now follows the n-grams ending at m-1.
            for j, d in enumerate(overlay):
                s = m - (min_n + j)
                if s < 0:
                    break
                d[tuple(ctx[s - offset:m - offset])] = s
            ctx.append(nxt)
        return draft


class CorpusIndex:
    """Cross-request n-gram index over finished requests' token histories.

    ``add`` stores one finished request's tokens (prompt + output). ``propose`` takes
    a live request's context and, for ``n = MIN_LONG_N, max_n .. min_n`` (longest
    first), looks up its last ``n`` tokens; the most recently added occurrence whose
    following token is known wins, and the draft is the run of tokens that followed
    it in that sequence (up to ``k``, never past its end). Holds at most
    ``max_tokens`` tokens: the oldest sequences are evicted first, with their index
    entries (memory stays bounded).
    ``add`` costs O(max_n) dict updates per token, ``propose`` O(max_n) lookups (and
    at most ``MAX_EXTEND`` comparisons).
    """

    MAX_EXTEND = 64  # tokens: how far back a match's length is measured
    MIN_LONG_N = 16  # tokens: the key length that finds a replay's own earlier position

    def __init__(self, max_tokens: int, max_n: int = 4, min_n: int = 3) -> None:
        if not (max_n >= min_n >= 1) or max_tokens <= max_n:
            raise ValueError(f"CorpusIndex needs max_n >= min_n >= 1 and max_tokens > max_n; "
                             f"got max_n={max_n}, min_n={min_n}, max_tokens={max_tokens}")
        self.max_tokens, self.max_n, self.min_n = max_tokens, max_n, min_n
        self._seqs: dict[int, list[int]] = {}  # id -> tokens, insertion order = age
        self._next_id = 0
        self._total = 0
        # Key lengths, longest first: a long key (if longer than max_n) places a
        # replayed context at its own earlier occurrence, where the most recent
        # occurrence of a short n-gram may be a common phrase of another request.
        self._ns = ([self.MIN_LONG_N] if self.MIN_LONG_N > max_n else []) + \
            list(range(max_n, min_n - 1, -1))
        # _maps[i]: n-gram of length _ns[i] -> (sequence id, start), most recent occurrence
        self._maps: list[dict[tuple[int, ...], tuple[int, int]]] = [{} for _ in self._ns]

    def __len__(self) -> int:
        """Tokens held."""
        return self._total

    def _ngrams(self, toks: list[int], n: int) -> Iterable[tuple[int, ...]]:
        """Every n-gram of ``toks`` with a known following token, by start position."""
        end = len(toks) - n
        if end <= 0:
            return iter(())
        return zip(*(toks[i:end + i] for i in range(n)))  # C-speed tuple building

    def add(self, tokens: Sequence[int] | np.ndarray | Iterable[int]) -> int:
        """Store one finished request's history (1-D token ids; only the last
        ``max_tokens`` of a longer one are kept). Returns the tokens stored (0: none)."""
        toks = _as_int_list(tokens)[-self.max_tokens:]
        if len(toks) <= self.min_n:
            return 0  # no n-gram with a follower
        sid, self._next_id = self._next_id, self._next_id + 1
        self._seqs[sid] = toks
        self._total += len(toks)
        for j, n in enumerate(self._ns):
            # overwrite: the newest sequence wins (and its latest occurrence in it)
            self._maps[j].update(zip(self._ngrams(toks, n), zip(repeat(sid), count())))
        while self._total > self.max_tokens:
            self.evict_oldest()
        return len(toks)

    def evict_oldest(self) -> None:
        """Drop the oldest stored sequence and its index entries."""
        sid = next(iter(self._seqs))
        toks = self._seqs.pop(sid)
        self._total -= len(toks)
        for j, n in enumerate(self._ns):
            d = self._maps[j]
            for key in self._ngrams(toks, n):
                hit = d.get(key)
                if hit is not None and hit[0] == sid:  # newer sequences keep their entries
                    del d[key]

    def propose(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """(up to ``k`` draft token ids continuing ``context``, the match length);
        ([], 0) without a match of at least ``min_n`` tokens. ``context``: 1-D token
        ids (Python ints). The lookup reads its last ``MIN_LONG_N``; the match length
        then extends backwards while the matched sequence and the context agree (up to
        ``MAX_EXTEND`` tokens), so a request replaying an earlier one reports a long
        match where a common phrase reports a short one."""
        _check_k(k)
        m = len(context)
        ctx = list(context[m - min(m, self._ns[0]):])
        for n, d in zip(self._ns, self._maps):
            if n > m:
                continue
            hit = d.get(tuple(ctx[len(ctx) - n:]))
            if hit is not None:
                sid, s = hit
                seq = self._seqs[sid]
                j, limit = n, min(m, s + n, self.MAX_EXTEND)
                while j < limit and seq[s + n - j - 1] == context[m - j - 1]:
                    j += 1
                return seq[s + n:s + n + k], j
        return [], 0
