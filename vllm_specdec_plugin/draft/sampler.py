"""Draft token choice per pass, on the draft's device: argmax for greedy rows, a sample
from q (the request's sampling pipeline over the draft's logits) for sampled rows; q
stays on the device as [rows, k, V] for the rejection sampler. A seeded sampled row
drafts with the noise its verification uses for that output token (vLLM's own seed
for it, ``compat/seeded.py``): accepted whenever that noise picks the same token
under q as under p.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Sequence

import torch

from vllm_specdec_plugin.compat.seeded import seeded_tokens
from vllm_specdec_plugin.token_draw import first_argmax, sample_from_weights
from vllm_specdec_plugin.sampling.pipeline import target_probs


class DraftSampler:
    """Chooses one round's drafts, rows in plan order. Per row: ``specs`` a SamplingSpec
    (sampled from q) or None (argmax); ``prompts`` / ``outputs`` its token ids (read
    only with a penalty); ``streams`` for a seeded row (its ``token_draw.SeedStream``,
    the output index its pass 0 drafts), else None. ``masks``:
    ``masks.apply(logits, pos, drafts)`` masks pass ``pos`` in place (structured rows)."""

    def __init__(self, specs: Sequence[Any], prompts: Sequence[Sequence[int]],
                 outputs: Sequence[Sequence[int]], streams: Sequence[tuple[Any, int] | None],
                 k_max: int, vocab_size: int, device: torch.device, masks: Any = None):
        self.device = device
        self.masks = masks
        self.sampled = [i for i, s in enumerate(specs) if s is not None]
        self.q: torch.Tensor | None = None
        if not self.sampled:
            return
        idx = self.sampled
        self.specs = [specs[i] for i in idx]
        self.streams = [streams[i] for i in idx]
        # Histories only for penalised rows (the pipeline reads no others): [S, L]
        # tensors whose other rows stay empty padding; not built when none has one.
        self.penalised = any(s.has_penalties for s in self.specs)
        if self.penalised:
            keep = [s.has_penalties for s in self.specs]
            self.prompts = _padded([prompts[i] if k else [] for i, k in zip(idx, keep)], device)
            self.outputs = _padded([outputs[i] if k else [] for i, k in zip(idx, keep)], device)
        self.q = torch.zeros((len(idx), k_max, vocab_size), dtype=torch.float32, device=device)
        # One uniform per unseeded row and pass, drawn once for the round on the
        # device: a pass launches no host-to-device copy. [k_max, S] float64.
        self.uniform = (torch.rand((k_max, len(idx)), dtype=torch.float64, device=device)
                        if any(s is None for s in self.streams) else None)
        self._rows: dict[int, torch.Tensor | slice] = {}  # by count: see _batch_rows

    @property
    def argmax_only(self) -> bool:
        """Every row drafts the argmax unmasked: a reduced vocabulary's logits suffice."""
        return not self.sampled and self.masks is None

    def pick(self, logits: torch.Tensor, pos: int, drafts: torch.Tensor,
             ids: torch.Tensor | None = None) -> torch.Tensor:
        """Draft ``pos`` ([n] int64) of the first n rows: logits [n, V] float32, or [n, N]
        of the sorted ``ids`` (int64 [N]; only when ``argmax_only``); drafts [B, k_max]
        holds the earlier drafts."""
        if ids is not None:  # sorted ids: the lowest id wins a tie, as over all of V
            return ids[first_argmax(logits)]
        if self.masks is not None:
            self.masks.apply(logits, pos, drafts)
        tokens = first_argmax(logits)
        # Rows run in plan order (k descending), so the sampled rows still drafting
        # at this pass are the first `count` of self.sampled.
        count = bisect_left(self.sampled, logits.shape[0])
        if not count:
            return tokens
        rows = self._batch_rows(count)
        if self.penalised:
            prompt = self.prompts[:count]
            history = torch.cat([self.outputs[:count], drafts[rows, :pos]], dim=1)
        else:
            prompt = history = [[]] * count
        seeded = [m for m in range(count) if self.streams[m] is not None]
        keep = [m in seeded for m in range(count)] if seeded else None
        q = target_probs(logits[rows], self.specs[:count], prompt, history, keep)  # [S, V]
        if not seeded:  # invert q's CDF with the round's uniforms
            tokens[rows] = sample_from_weights(q, self.uniform[pos, :count])
        else:
            # Seeded rows take their output token's own noise on q's logits (as their
            # verification does on p's); the rows kept as logits become q after.
            choice = torch.empty(count, dtype=torch.long, device=self.device)
            for m in seeded:
                stream, start = self.streams[m]
                choice[m] = seeded_tokens(q[m:m + 1], stream, start + pos)[0]
                q[m] = torch.softmax(q[m], dim=-1)
            if len(seeded) < count:  # unseeded rows too (so self.uniform exists)
                free = torch.tensor([m for m in range(count) if self.streams[m] is None],
                                    device=self.device)
                choice[free] = sample_from_weights(q[free], self.uniform[pos, free])
            tokens[rows] = choice
        self.q[:count, pos] = q
        return tokens

    def _batch_rows(self, count: int) -> torch.Tensor | slice:
        """The batch rows of the first ``count`` sampled rows: a slice where they are rows
        0..count-1 (views), else an index tensor made once per count."""
        rows = self._rows.get(count)
        if rows is None:
            if self.sampled[count - 1] == count - 1:
                rows = slice(0, count)
            else:
                rows = torch.tensor(self.sampled[:count], device=self.device)
            self._rows[count] = rows
        return rows


def _padded(rows: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """[R, max len] int64, -1 padding (ignored by the sampling pipeline)."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out.to(device)
