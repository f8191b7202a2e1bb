"""Draft token choice per pass, on the draft's device: argmax for greedy rows, a
sample from q (the request's own sampling pipeline over the draft's logits) for
sampled rows. q stays on the device in the [rows, k, V] form the rejection sampler
consumes; nothing round-trips through host memory.

A seeded sampled row drafts first_argmax(q_t / E_t) at absolute position t, with the
noise E_t (`token_draw.position_noise`) its verification uses for p_t: a sample from
q coupled to the target's y_t, accepted with probability >= (1 - TV) / (1 + TV)
(a little below the 1 - TV of unseeded rows' rejection sampling).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Sequence

import torch

from vllm_specdec_plugin.token_draw import (coupled_token, first_argmax, position_noise,
                                            sample_from_weights)
from vllm_specdec_plugin.sampling.pipeline import target_probs


class DraftSampler:
    """Chooses the drafts of one round. Rows follow the round's plan order.

    specs: per row, a SamplingSpec (sampled from q) or None (argmax).
    prompts / outputs: per row, the request's prompt and output token ids, read only
      for rows with a penalty (penalties see output + drafts so far); others may be [].
    seeds: per row, the request's seed (int) or None; read for sampled rows only.
    masks: optional; ``masks.apply(logits, pos, drafts)`` masks the logits of pass
      ``pos`` in place before the drafts are chosen (structured-output rows).
    lengths: per row, the committed length L (prompt + output tokens), required when
      a sampled row is seeded: pass ``pos`` drafts the token at position L + pos.
    """

    def __init__(self, specs: Sequence[Any], prompts: Sequence[Sequence[int]],
                 outputs: Sequence[Sequence[int]], seeds: Sequence[int | None],
                 k_max: int, vocab_size: int, device: torch.device, masks: Any = None,
                 lengths: Sequence[int] | None = None):
        self.device = device
        self.masks = masks
        self.sampled = [i for i, s in enumerate(specs) if s is not None]
        self.q: torch.Tensor | None = None
        if not self.sampled:
            return
        idx = self.sampled
        self.specs = [specs[i] for i in idx]
        self.seeds = [seeds[i] for i in idx]
        if any(s is not None for s in self.seeds) and lengths is None:
            raise ValueError("seeded sampled rows need lengths (their committed length L)")
        self.lengths = [lengths[i] for i in idx] if lengths is not None else [0] * len(idx)
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
                        if any(s is None for s in self.seeds) else None)
        self._rows: dict[int, torch.Tensor | slice] = {}  # by count: see _batch_rows

    @property
    def argmax_only(self) -> bool:
        """Every row drafts the argmax with no mask: a reduced draft vocabulary's
        logits suffice (``pick`` with ``ids``), no [n, V] row is needed."""
        return not self.sampled and self.masks is None

    def pick(self, logits: torch.Tensor, pos: int, drafts: torch.Tensor,
             ids: torch.Tensor | None = None) -> torch.Tensor:
        """Draft ``pos`` of the first ``len(logits)`` rows. logits [n, V] float32, or
        with ``ids`` (int64 [N], sorted; only when ``argmax_only``) the logits of those
        tokens, [n, N]; drafts [B, k_max] int64 holds the earlier drafts. Returns [n]
        int64."""
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
        q = target_probs(logits[rows], self.specs[:count], prompt, history)  # [S, V]
        # Seeded rows race q against their position's noise (shared with the target's
        # verification); the others invert q's CDF with the round's uniforms.
        seeded = [m for m in range(count) if self.seeds[m] is not None]
        if not seeded:
            tokens[rows] = sample_from_weights(q, self.uniform[pos, :count])
        else:
            noise = torch.ones_like(q)  # unseeded rows' entries are never read
            for m in seeded:
                noise[m] = position_noise(self.seeds[m], self.lengths[m] + pos, q.shape[1],
                                          self.device)
            choice = coupled_token(q, noise)                               # [S]
            if len(seeded) < count:  # unseeded rows too (so self.uniform exists)
                free = torch.tensor([m for m in range(count) if self.seeds[m] is None],
                                    device=self.device)
                choice[free] = sample_from_weights(q[free], self.uniform[pos, free])
            tokens[rows] = choice
        self.q[:count, pos] = q
        return tokens

    def _batch_rows(self, count: int) -> torch.Tensor | slice:
        """The batch rows of the first ``count`` sampled rows: a slice where they are
        rows 0..count-1 (every row sampled: views, no gather), else an index tensor
        made once per count (a host-to-device copy)."""
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
