"""The q channel: one round's draft distributions as the rejection sampler reads them at
the next step, [rows, K, V] float32 on the target's device, a row per drafted request
(vLLM drops the batch's q if one is missing). Greedy and n-gram rows are point masses;
sampled rows take q from the draft sampler's buffer (all sampled: the buffer itself).
"""

from __future__ import annotations

from typing import Sequence

import torch


def build(sampled_rows: Sequence[int], q: torch.Tensor | None,
          drafts: Sequence[Sequence[int]], vocab_size: int,
          device: torch.device) -> torch.Tensor | None:
    """q for every drafted row, None when none was sampled (a missing q is all point
    masses). sampled_rows: indices into ``drafts`` (every drafted row's tokens, in
    channel order) of the rows drafted from q, which q [S, >=k, V] holds in that order."""
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
