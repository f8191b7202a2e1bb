"""Hard token constraints at speculative positions (pure torch; no vLLM import).

They forbid tokens (logit -> -inf) and are applied to raw logits before the
sampling pipeline. A -inf survives logit_bias, penalties and temperature unchanged,
so applying the masks first gives the same distribution as vLLM's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True, slots=True)
class TokenConstraints:
    """One request's hard constraints."""

    min_tokens: int = 0
    """Stop tokens are forbidden while fewer than this many tokens were generated."""
    stop_token_ids: tuple[int, ...] = ()
    """Tokens that end the request (EOS unless ignore_eos, plus stop_token_ids)."""
    allowed_token_ids: tuple[int, ...] | None = None
    """If set, every other token is forbidden."""
    bad_words: tuple[tuple[int, ...], ...] = ()
    """Token sequences that must not be completed."""

    @property
    def active(self) -> bool:
        return bool(self.min_tokens or self.allowed_token_ids is not None or self.bad_words)


def apply_constraints(
    logits: torch.Tensor,                       # [T, V] float, modified in place
    constraints: Sequence[TokenConstraints],    # [B]
    output_token_ids: Sequence[Sequence[int]],  # [B][L_b] generated so far
    draft_token_ids: Sequence[Sequence[int]],   # [B][k_b]; position j sees drafts[:j]
) -> torch.Tensor:
    """Forbid tokens at every position j of every row; returns ``logits``.

    Flat layout (vLLM's): request b owns k_b + 1 consecutive rows, its positions
    0..k_b, so T = sum(k_b + 1).
    """
    ninf = float("-inf")
    V = logits.shape[1]
    need = sum(len(d) + 1 for d in draft_token_ids)
    if need != logits.shape[0]:
        raise ValueError(f"logits has {logits.shape[0]} rows, drafts need {need}")
    start = 0
    for b, c in enumerate(constraints):
        drafts = list(draft_token_ids[b])
        rows = logits[start:start + len(drafts) + 1]    # a view: writes reach logits
        start += len(drafts) + 1
        if not c.active:
            continue
        if c.allowed_token_ids is not None:
            keep = torch.zeros(V, dtype=torch.bool, device=logits.device)
            keep[[t for t in c.allowed_token_ids if 0 <= t < V]] = True
            rows[:, ~keep] = ninf
        out = list(output_token_ids[b])
        for j in range(len(drafts) + 1):
            history = out + drafts[:j]
            if len(history) < c.min_tokens and c.stop_token_ids:
                rows[j, [t for t in c.stop_token_ids if 0 <= t < V]] = ninf
            for word in c.bad_words:
                prefix, last = word[:-1], word[-1]
                if 0 <= last < V and (not prefix or tuple(history[-len(prefix):]) == tuple(prefix)):
                    rows[j, last] = ninf
    return logits


def constraints_from_sampling_params(sp) -> TokenConstraints:
    """Duck-typed from a vLLM SamplingParams (reads attributes only)."""
    stop = tuple(sorted(getattr(sp, "all_stop_token_ids", None) or ()))
    allowed = getattr(sp, "allowed_token_ids", None)
    from vllm_specdec_plugin.compat.sampling_params import bad_words_token_ids

    bad = bad_words_token_ids(sp)
    return TokenConstraints(
        min_tokens=int(getattr(sp, "min_tokens", 0) or 0),
        stop_token_ids=stop,
        allowed_token_ids=tuple(allowed) if allowed else None,
        bad_words=tuple(tuple(w) for w in bad),
    )
