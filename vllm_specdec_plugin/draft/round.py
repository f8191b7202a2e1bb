"""One drafting round: a varlen pass over the committed tokens the draft has not seen
(lazy prefill, chunked), then k-1 batched single-token decode passes.

No padding across requests: pass 1 is a flat varlen batch; decode passes take a
prefix of the rows, since rows are sorted by k descending (a row drops out once it has
its k drafts). The round's tensors (block table, lengths, query starts) are built
once; each decode pass only advances positions, sequence lengths and slots in place,
on the device. The k loop has no host-device sync: the drafts come back to the host
once, after the last pass.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from vllm_specdec_plugin.compat.draft_model import DraftKernels
from vllm_specdec_plugin.draft.sampler import DraftSampler


def run_round(kernels: DraftKernels, rows: Sequence, sampler: DraftSampler,
              device: torch.device, first_pass_done: Callable[[], None] | None = None
              ) -> tuple[torch.Tensor, int]:
    """Run the passes; returns (drafts [n_draft, k_max] int64 on device, passes run).

    rows: sorted by ``k`` descending; each has ``req.table.blocks``, ``new_tokens``,
    ``cached`` and ``k``. Entry [i, j] of the result is valid for j < rows[i].k.
    first_pass_done: called between pass 1 and the decode passes (when there are any),
    so that a caller can time the decode passes alone.
    """
    bs = kernels.block_size
    ks = [r.k for r in rows]
    n_draft = sum(1 for k in ks if k > 0)
    k_max = ks[0] if rows else 0
    # --- the round's tensors, built once on the host and copied over once
    qlens = [len(r.new_tokens) for r in rows]
    starts = [r.cached for r in rows]
    nb = max(len(r.req.table.blocks) for r in rows)
    table = torch.zeros((len(rows), nb), dtype=torch.int32)
    for i, r in enumerate(rows):
        table[i, : len(r.req.table.blocks)] = torch.tensor(r.req.table.blocks, dtype=torch.int32)
    ids = torch.tensor([t for r in rows for t in r.new_tokens], dtype=torch.int32)
    pos = torch.cat([torch.arange(s, s + q) for s, q in zip(starts, qlens)])
    qsl_cpu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    qsl_cpu[1:] = torch.tensor(qlens, dtype=torch.int32).cumsum(0)
    seq_cpu = torch.tensor([s + q for s, q in zip(starts, qlens)], dtype=torch.int32)
    table, ids, pos, qsl, seq = (t.to(device, non_blocking=True)
                                 for t in (table, ids, pos, qsl_cpu, seq_cpu))
    row_of = torch.repeat_interleave(torch.arange(len(rows), device=device),
                                     torch.tensor(qlens, device=device))
    slots = _slots(table, row_of, pos, bs)

    # --- pass 1: every row's new tokens (varlen); logits at the drafting rows' last token
    md = kernels.metadata(qsl, qsl_cpu, seq, seq_cpu, int(ids.shape[0]), max(qlens),
                          int(seq_cpu.max()), table, slots, pos)
    # greedy rows without a mask need only the reduced vocabulary's logits (no [n, V])
    reduced = kernels.vocab_ids is not None and sampler.argmax_only
    vocab = kernels.vocab_ids if reduced else None
    logits = kernels.forward(md, ids, pos, slots, (qsl[1:n_draft + 1] - 1).long(), reduced)
    drafts = torch.zeros((n_draft, max(k_max, 1)), dtype=torch.long, device=device)
    drafts[:, 0] = sampler.pick(logits, 0, drafts, vocab)
    passes = 1
    if k_max <= 1:
        return drafts, passes
    if first_pass_done is not None:
        first_pass_done()

    # --- decode passes: the first n rows (k > step) feed their last draft
    lengths_cpu = seq_cpu[:n_draft]                         # committed length L per row (host)
    positions = seq[:n_draft].long() - 1                    # advanced in place below
    seq_lens = seq[:n_draft].clone()
    arange = torch.arange(n_draft + 1, dtype=torch.int32)
    arange_dev = arange.to(device)
    table = table[:n_draft]
    for step in range(1, k_max):
        n = sum(1 for k in ks if k > step)
        positions += 1                                      # draft d_step sits at L + step - 1
        seq_lens += 1
        p, s = positions[:n], seq_lens[:n]
        slot = _slots(table, None, p, bs, n)
        seq_host = lengths_cpu[:n] + step
        md = kernels.metadata(arange_dev[: n + 1], arange[: n + 1], s, seq_host, n, 1,
                              int(seq_host.max()), table[:n], slot, p)
        logits = kernels.forward(md, drafts[:n, step - 1].to(torch.int32), p, slot,
                                 arange_dev[:n].long(), reduced)
        drafts[:n, step] = sampler.pick(logits, step, drafts, vocab)
        passes += 1
    return drafts, passes


def _slots(table: torch.Tensor, row_of: torch.Tensor | None, pos: torch.Tensor,
           block_size: int, n: int | None = None) -> torch.Tensor:
    """Cache slot of each token: blocks[row][pos // bs] * bs + pos % bs, int64 [T]."""
    if row_of is None:  # one token per row, rows 0..n-1
        block = table[:n].gather(1, (pos // block_size).unsqueeze(1).to(torch.int64)).squeeze(1)
    else:
        block = table[row_of, pos // block_size]
    return block.to(torch.int64) * block_size + pos % block_size


def draft_plans(kernels: DraftKernels, plans: Sequence, sampler: DraftSampler,
                device: torch.device, stats,
                first_pass_done: Callable[[], None] | None = None) -> int:
    """Run one round over ``plans`` (``planning.Plan``, sorted by k descending) and
    book it: each plan's ``drafts`` (cut where its grammar ended) and cached tokens,
    and ``stats`` (``ProposerStats``) prefill counts. Returns the passes run.
    first_pass_done: as in ``run_round``."""
    drafts, passes = run_round(kernels, plans, sampler, device, first_pass_done)
    drafts = drafts.tolist()  # the round's one device -> host copy
    limits = sampler.masks.finish() if sampler.masks else [None] * len(plans)
    fed = sum(len(p.new_tokens) for p in plans)
    stats.max_round_prefill = max(stats.max_round_prefill, fed)
    for i, p in enumerate(plans):
        stats.prefill_tokens += len(p.new_tokens)
        p.req.tokens.extend(p.new_tokens)
        if p.k > 0:  # a grammar that ended stops its row's drafts early
            p.drafts = drafts[i][: p.k if limits[i] is None else min(p.k, limits[i])]
            p.req.tokens.extend(p.drafts[:-1])  # d_k's KV is never computed
        p.req.table.num_tokens = len(p.req.tokens)
    return passes
