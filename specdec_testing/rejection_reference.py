"""The slow, obviously-correct rejection sampler that tests hold `rejection_sample` to
(test code: not in the wheel).

One request at a time, in Python loops, with the same contract and the same random
draws as `rejection.rejection_sample` (its docstring: vocabulary, layout, draws), so
from the same default-generator state both return the same tokens bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_specdec_plugin.rejection import PLACEHOLDER_TOKEN_ID, check_shapes
from vllm_specdec_plugin.token_draw import sample_from_weights


def rejection_sample_reference(
    draft_token_ids: torch.Tensor,  # [B, K] int64, placeholder-padded past num_draft
    num_draft_tokens: torch.Tensor,  # [B] int64 in 0..K
    draft_probs: torch.Tensor | None,  # [sum(n_b), V] float, or None (point mass)
    target_probs: torch.Tensor,  # [sum(n_b + 1), V] float
    is_greedy: torch.Tensor,  # [B] bool
    seeded: Sequence[bool] | None = None,  # [B]
    seeded_tokens: torch.Tensor | None = None,  # [T]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slow, obviously-correct per-row loop; same contract as `rejection_sample`."""
    batch, max_k, vocab, device = check_shapes(
        draft_token_ids, num_draft_tokens, draft_probs, target_probs, is_greedy
    )
    coupled = list(seeded) if seeded is not None else [False] * batch
    # Unseeded sampled rows: the same one batched draw as the fast version.
    shared = None
    if not all(g or c for g, c in zip(is_greedy.tolist(), coupled)):
        shared = torch.rand(batch, max_k + 1, dtype=torch.float64, device=device)
    output = torch.full(
        (batch, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device
    )
    num_accepted = torch.zeros(batch, dtype=torch.long, device=device)
    p_start = q_start = 0

    for b in range(batch):
        n = int(num_draft_tokens[b])
        p = target_probs[p_start : p_start + n + 1].to(torch.float32)  # [n + 1, V]
        q_all = None if draft_probs is None else draft_probs[q_start : q_start + n].float()
        y = None if seeded_tokens is None else seeded_tokens[p_start : p_start + n + 1]
        p_start, q_start = p_start + n + 1, q_start + n
        tokens: list[int] = []

        if bool(is_greedy[b]) or coupled[b]:
            if coupled[b]:  # y_j: the token the request's own noise samples (the caller's)
                best_of = [int(y[j]) for j in range(n + 1)]
            else:
                best_of = [int(p[j].argmax()) for j in range(n + 1)]
            for j in range(n):
                best = best_of[j]
                if int(draft_token_ids[b, j]) != best:
                    tokens.append(best)  # recovered
                    break
                tokens.append(best)  # accepted
            else:
                tokens.append(best_of[n])  # bonus
            num_accepted[b] = len(tokens) - 1
            output[b, : len(tokens)] = torch.tensor(tokens)
            continue

        uniforms = shared[b, : n + 1]  # u_0..u_n
        rejected_at = None
        for j in range(n):
            x = int(draft_token_ids[b, j])
            if not 0 <= x < vocab:
                rejected_at, q_j = j, torch.zeros(vocab, device=device)
                break
            q_j = _draft_dist(q_all, j, x, vocab, device)
            px, qx = float(p[j, x]), float(q_j[x])
            if qx > 0 and px / qx >= float(uniforms[j]):
                tokens.append(x)  # accepted
            else:
                rejected_at = j
                break
        if rejected_at is None:
            dist = p[n]  # bonus
        else:
            dist = (p[rejected_at] - q_j).clamp_min(0.0)  # recovered
            if not bool((dist > 0).any()):
                dist = p[rejected_at]  # p == q up to float error
        tokens.append(int(sample_from_weights(dist, uniforms[n])))
        num_accepted[b] = len(tokens) - 1
        output[b, : len(tokens)] = torch.tensor(tokens)

    return output, num_accepted


def _draft_dist(
    q_all: torch.Tensor | None, j: int, x: int, vocab: int, device
) -> torch.Tensor:
    """q_j of one request (q_all [n, V] or None) as a [V] float32 vector (one-hot of x
    for a point mass)."""
    if q_all is not None and bool((q_all[j] > 0).any()):
        return q_all[j]
    q = torch.zeros(vocab, dtype=torch.float32, device=device)
    q[x] = 1.0
    return q
