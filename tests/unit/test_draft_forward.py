"""The draft's paged-KV forward equals transformers' Llama on the same weights,
across lazy prefill, batched incremental steps, non-contiguous blocks and rollback."""

import pytest
import torch

from vllm_specdec_plugin.draft.llama import DraftLlama
from vllm_specdec_plugin.kv import BlockAllocator, BlockTable, PagedKVCache
from vllm_specdec_plugin.kv.paged_cache import BatchLayout


@pytest.fixture(scope="module", params=["default", "llama3"])
def tiny_llama(tmp_path_factory, request):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    rope = None
    if request.param == "llama3":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rope_scaling=rope, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval().float()
    path = tmp_path_factory.mktemp("tiny") / request.param
    model.save_pretrained(path)
    return model, path


def _ref_logits(model, seq):
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0].float()


def _run(draft, cache, alloc, tables, seqs, starts):
    """Feed seqs[b][starts[b]:] for every request in one batched forward."""
    for t, s in zip(tables, seqs):
        alloc.reserve(t, len(s))
    nb = max(len(t.blocks) for t in tables)
    bt = torch.zeros((len(tables), nb), dtype=torch.int64)
    for i, t in enumerate(tables):
        bt[i, : len(t.blocks)] = torch.tensor(t.blocks)
    qlens = torch.tensor([len(s) - st for s, st in zip(seqs, starts)])
    layout = BatchLayout.build(qlens, torch.tensor([len(s) for s in seqs]), bt, alloc.block_size)
    toks = torch.tensor([x for s, st in zip(seqs, starts) for x in s[st:]])
    out = draft.forward(toks, layout, cache)
    for t, s in zip(tables, seqs):
        t.num_tokens = len(s)
    return out


def test_paged_forward_matches_transformers(tiny_llama):
    model, path = tiny_llama
    draft = DraftLlama(path, torch.float32, torch.device("cpu"))
    alloc = BlockAllocator(num_blocks=32, block_size=4)
    # Scramble the free list so block tables are non-contiguous.
    alloc._free.rotate(7)
    cache = PagedKVCache(draft.num_layers, 32, 4, draft.num_kv_heads, draft.head_dim,
                         torch.float32, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (9, 3, 14)]
    tables = [BlockTable() for _ in seqs]
    logits = _run(draft, cache, alloc, tables, seqs, [0, 0, 0])       # lazy prefill
    for b, s in enumerate(seqs):
        torch.testing.assert_close(logits[b], _ref_logits(model, s)[-1], atol=1e-4, rtol=1e-4)
    # Three incremental single-token steps, batched.
    for _ in range(3):
        starts = [len(s) for s in seqs]
        seqs = [s + [int(torch.randint(0, 97, (1,), generator=g))] for s in seqs]
        logits = _run(draft, cache, alloc, tables, seqs, starts)
        for b, s in enumerate(seqs):
            torch.testing.assert_close(logits[b], _ref_logits(model, s)[-1], atol=1e-4, rtol=1e-4)
    # Roll request 0 back by 2 tokens and request 2 by 5, then feed different tokens.
    for b, back in ((0, 2), (2, 5)):
        alloc.trim(tables[b], len(seqs[b]) - back)
        seqs[b] = seqs[b][:-back]
    starts = [t.num_tokens for t in tables]
    seqs = [s + [5, 6] for s in seqs]
    logits = _run(draft, cache, alloc, tables, seqs, starts)
    for b, s in enumerate(seqs):
        torch.testing.assert_close(logits[b], _ref_logits(model, s)[-1], atol=1e-4, rtol=1e-4)
