"""Token histories for the sampling pipeline's penalties, in the shapes vLLM's op reads.

A row's *prompt* history feeds only the repetition penalty; its *output* history
(tokens generated so far) feeds all three penalties. Token ids outside [0, V) in a
history (e.g. placeholder -1) are ignored, as vLLM does with its `-1 -> vocab_size`
padding. In speculation, the distribution at draft position j (0-based) is conditioned
on the drafts d_0..d_{j-1}, so its output history is `output + drafts[:j]` (vLLM
`RejectionSampler._combine_outputs_with_spec_tokens`; the bonus position gets all
drafts, `Sampler._combine_outputs_with_spec_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# A history is either one list of token ids per row, or a [B, L] integer tensor in
# which every entry outside [0, V) is padding.
Histories = Sequence[Sequence[int]] | torch.Tensor


def expand_histories(
    output_token_ids: Sequence[Sequence[int]],  # [B][L_b]
    draft_token_ids: Sequence[Sequence[int]],  # [B][k_b]
) -> list[list[list[int]]]:
    """Per-position output histories for speculation.

    Returns `[B][k_b + 1][L_b + j]`: entry `[b][j]` is `output[b] + drafts[b][:j]`,
    the history that the distribution at draft position j (j = k_b is the bonus
    position) is conditioned on. Use it for the target's p at positions 0..k_b and
    for the draft's q at positions 0..k_b - 1 alike.
    """
    if len(output_token_ids) != len(draft_token_ids):
        raise ValueError("output_token_ids and draft_token_ids differ in batch size")
    return [
        [[*out, *drafts[:j]] for j in range(len(drafts) + 1)]
        for out, drafts in zip(output_token_ids, draft_token_ids)
    ]


def check_histories(histories: Histories, num_rows: int) -> None:
    if isinstance(histories, torch.Tensor):
        if histories.ndim != 2 or histories.shape[0] != num_rows:
            raise ValueError(f"history tensor must be [{num_rows}, L]")
    elif len(histories) != num_rows:
        raise ValueError(f"got {len(histories)} histories for {num_rows} rows")


def history_rows(histories: Histories, rows: list[int]) -> Histories:
    """The histories of ``rows`` only (a tensor is indexed, lists are picked)."""
    if isinstance(histories, torch.Tensor):
        return histories[torch.tensor(rows, dtype=torch.long, device=histories.device)]
    return [histories[r] for r in rows]


def pad_histories(
    histories: Histories, num_rows: int, vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[B, L] int64 with every id outside [0, V) mapped to the pad bucket V."""
    check_histories(histories, num_rows)
    if isinstance(histories, torch.Tensor):
        tokens = histories.to(device=device, dtype=torch.long)
    else:
        width = max((len(h) for h in histories), default=0)
        tokens = torch.full((num_rows, width), vocab_size, dtype=torch.long)
        for row, hist in enumerate(histories):
            if len(hist):
                tokens[row, : len(hist)] = torch.as_tensor(hist, dtype=torch.long)
        tokens = tokens.to(device)
    return tokens.masked_fill((tokens < 0) | (tokens >= vocab_size), vocab_size)
