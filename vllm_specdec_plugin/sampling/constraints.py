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
    logits: torch.Tensor,                       # [B, P, V] float, modified in place
    constraints: Sequence[TokenConstraints],    # [B]
    output_token_ids: Sequence[Sequence[int]],  # [B][L_b] generated so far
    draft_token_ids: Sequence[Sequence[int]],   # [B][k_b]; position j sees drafts[:j]
) -> torch.Tensor:
    """Forbid tokens at every position j of every row; returns ``logits``."""
    ninf = float("-inf")
    P, V = logits.shape[1], logits.shape[2]
    for b, c in enumerate(constraints):
        if not c.active:
            continue
        if c.allowed_token_ids is not None:
            keep = torch.zeros(V, dtype=torch.bool, device=logits.device)
            keep[[t for t in c.allowed_token_ids if 0 <= t < V]] = True
            logits[b, :, ~keep] = ninf
        out, drafts = list(output_token_ids[b]), list(draft_token_ids[b])
        for j in range(P):
            history = out + drafts[:j]
            if len(history) < c.min_tokens and c.stop_token_ids:
                logits[b, j, [t for t in c.stop_token_ids if 0 <= t < V]] = ninf
            for word in c.bad_words:
                prefix, last = word[:-1], word[-1]
                if 0 <= last < V and (not prefix or tuple(history[-len(prefix):]) == tuple(prefix)):
                    logits[b, j, last] = ninf
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
