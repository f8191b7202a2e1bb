"""The brute-force n-gram drafter that tests hold ``ngram.NGramIndex`` to (test code: not
in the wheel): the rules of the ``ngram`` module docstring, scanned directly."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vllm_specdec_plugin.ngram import NGramConfig, as_int_list, check_k, choose
from vllm_specdec_plugin.tuning import NGRAM_MAX_N, NGRAM_MIN_PROB

Followers = dict[int, int]  # following token -> occurrences


def propose_reference(
    history: Sequence[int] | np.ndarray,
    k: int,
    max_n: int = NGRAM_MAX_N,
    min_n: int = 1,
    window: int = 1024,
    min_prob: float = NGRAM_MIN_PROB,
) -> list[int]:
    """Brute-force O(k * max_n * window * n) scan of ``history`` ([L] token ids): the
    specification ``NGramIndex`` must match."""
    NGramConfig(max_n, min_n, window, min_prob)
    check_k(k)
    ctx = as_int_list(history)
    lo = max(0, len(ctx) - window)
    draft: list[int] = []
    conf = 1.0
    while len(draft) < k:
        found = match_followers(ctx, lo, max_n, min_n)
        pick = None if found is None else choose(*found)
        if pick is None or conf * pick[1] < min_prob:
            break
        conf *= pick[1]
        draft.append(pick[0])
        ctx.append(pick[0])
    return draft


def match_followers(ctx: list[int], lo: int, max_n: int, min_n: int) -> tuple[Followers, int] | None:
    """Brute-force scan: the follower counts of the longest suffix of ``ctx`` (``max_n ..
    min_n`` tokens) that also starts at ``lo .. len(ctx) - n - 1``, and its most recent
    occurrence's follower; None without a match."""
    m = len(ctx)
    for n in range(max_n, min_n - 1, -1):
        suffix = ctx[m - n:] if n <= m else None
        starts = [p for p in range(lo, m - n) if ctx[p:p + n] == suffix]
        if starts:
            followers: Followers = {}
            for p in starts:
                followers[ctx[p + n]] = followers.get(ctx[p + n], 0) + 1
            return followers, ctx[starts[-1] + n]
    return None
