"""The q channel: the draft distributions of one round, in the form vLLM's (and our)
rejection sampler reads at the next step: [rows, K, V] float32 on the target's device,
one row per drafted request.

Every drafted row needs an entry: vLLM drops the whole batch's q if one drafted
request is missing. Rows drafted greedily (greedy requests in a mixed batch, n-gram
drafts) are point masses. Sampled rows take q straight from the draft sampler's
device buffer; a round with every row sampled hands over that buffer itself.
"""

from __future__ import annotations

from typing import Sequence

import torch


def build(sampled_rows: Sequence[int], q: torch.Tensor | None,
          drafts: Sequence[Sequence[int]], vocab_size: int,
          device: torch.device) -> torch.Tensor | None:
    """q for every drafted row, or None when no row was sampled (all point masses:
    the rejection sampler treats a missing q exactly so).

    sampled_rows: indices (into ``drafts``) of rows drafted from q; q [S, >=k, V] holds
      them in that order. drafts: every drafted row's draft tokens, in channel order.
    """
    if not sampled_rows or q is None:
        return None
    k = max(len(d) for d in drafts)
    if len(sampled_rows) == len(drafts) and q.shape[1] >= k \
            and list(sampled_rows) == list(range(len(drafts))):
        # Every row sampled, in channel order: the sampler's own buffer, no [rows, k, V]
        # copy (a fresh buffer each round; positions past a row's k stay zero).
        return q[:, :k].to(device)
    probs = torch.zeros((len(drafts), k, vocab_size), dtype=torch.float32, device=device)
    sampled = torch.tensor(list(sampled_rows), device=device)
    kq = min(k, q.shape[1])
    probs[sampled, :kq] = q[:, :kq]   # positions past a row's k are zero in q
    is_sampled = set(sampled_rows)
    rows, cols, toks = [], [], []
    for i, d in enumerate(drafts):
        if i not in is_sampled:
            rows += [i] * len(d)
            cols += range(len(d))
            toks += d
    if rows:
        idx = [torch.tensor(x, device=device) for x in (rows, cols, toks)]
        probs[idx[0], idx[1], idx[2]] = 1.0
    return probs
