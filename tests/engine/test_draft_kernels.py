"""The draft on vLLM's model class and CPU attention backend, over the plugin's own
block tables, computes what transformers computes with the same weights: lazy
prefill, a chunked prefill, decode passes on scattered blocks, and a pass after a
rollback by trim. For the Llama draft and its Qwen2 twin (a second architecture).
"""

import pytest
import torch

from specdec_testing import standalone
from vllm_specdec_plugin.compat import draft_model
from vllm_specdec_plugin.draft.round import _slots

BS = 32


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def loaded(ci_pair, request):
    from transformers import AutoModelForCausalLM

    from specdec_fixtures.qwen2_draft import ensure_qwen2_draft

    path = ci_pair.draft if request.param == "llama" else ensure_qwen2_draft(ci_pair.draft)
    cfg = standalone.vllm_config(str(ci_pair.target), None, max_model_len=512)
    before = set(cfg.compilation_config.static_forward_context)
    kernels = draft_model.load(cfg, path, BS, 24, torch.float32, torch.device("cpu"))
    ref = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32).eval()
    # Separate registries: the target's layer names are untouched by the draft's.
    assert set(cfg.compilation_config.static_forward_context) == before
    assert all(n.startswith(draft_model.MODEL_TAG + ".") for n in kernels.layer_names)
    return kernels, ref, request.param


def _pass(kernels, tables, seqs, starts, reduced=False):
    """Feed seqs[b][starts[b]:] of every row in one varlen pass; logits at each row's end."""
    B = len(seqs)
    qlens = [len(s) - st for s, st in zip(seqs, starts)]
    table = torch.zeros((B, max(len(t) for t in tables)), dtype=torch.int32)
    for i, t in enumerate(tables):
        table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    qsl = torch.zeros(B + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(qlens).cumsum(0)
    seq = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    pos = torch.cat([torch.arange(st, len(s)) for s, st in zip(seqs, starts)])
    rows = torch.repeat_interleave(torch.arange(B), torch.tensor(qlens))
    slots = _slots(table, rows, pos, BS)
    ids = torch.tensor([t for s, st in zip(seqs, starts) for t in s[st:]], dtype=torch.int32)
    md = kernels.metadata(qsl, qsl, seq, seq, len(ids), max(qlens), int(seq.max()), table, slots, pos)
    return kernels.forward(md, ids, pos, slots, (qsl[1:] - 1).long(), reduced)


def _check(ref, seqs, logits, what):
    with torch.no_grad():
        for b, s in enumerate(seqs):
            want = ref(torch.tensor([s])).logits[0, -1].float()
            assert (logits[b] - want).abs().max() < 1e-3, f"{what}: row {b}"
            assert int(logits[b].argmax()) == int(want.argmax()), f"{what}: row {b}"


def test_matches_transformers_through_prefill_decode_and_rollback(loaded):
    kernels, ref, _ = loaded
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(4, 2048, (n,), generator=g).tolist() for n in (45, 7, 100)]
    tables = [[5, 9, 2], [3], [8, 1, 4, 6]]                     # scattered, own blocks
    _check(ref, seqs, _pass(kernels, tables, seqs, [0, 0, 0]), "prefill")
    for step in range(3):                                        # batched decode passes
        starts = [len(s) for s in seqs]
        for s in seqs:
            s.append(int(torch.randint(4, 2048, (1,), generator=g)))
        _check(ref, seqs, _pass(kernels, tables, seqs, starts), f"decode {step}")
    # Roll row 0 back by 4 (trim) and row 2 by 40 (drops a whole block), feed new tokens.
    seqs[0], seqs[2] = seqs[0][:-4], seqs[2][:-40]
    tables[2] = tables[2][:3]
    starts = [len(s) for s in seqs]
    seqs = [s + [17, 18] for s in seqs]
    _check(ref, seqs, _pass(kernels, tables, seqs, starts), "after rollback")


def test_chunked_prefill_equals_one_pass(loaded):
    kernels, ref, _ = loaded
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(4, 2048, (150,), generator=g).tolist()
    table = [[10, 11, 12, 13, 14]]
    for end in (40, 80, 150):                                     # three chunks, one row
        logits = _pass(kernels, table, [seq[:end]], [end - 40 if end < 150 else 80])
    _check(ref, [seq], logits, "chunked prefill")


def test_reduced_vocabulary_computes_only_its_logits(loaded):
    """``draft_vocab``: the set's logits are the full head's, every other is OUTSIDE."""
    from dataclasses import replace

    from vllm_specdec_plugin.draft_vocab import OUTSIDE

    kernels, _, _ = loaded
    ids = torch.arange(3, 2048, 5)
    reduced = replace(kernels, vocab_size=2048, vocab_ids=ids,
                      head=draft_model.reduced_head(kernels.model, ids, torch.device("cpu")))
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(4, 2048, (n,), generator=g).tolist() for n in (9, 40)]
    tables = [[0], [1, 2]]
    full = _pass(kernels, tables, seqs, [0, 0])
    part = _pass(reduced, tables, seqs, [0, 0])
    assert part.shape == full.shape == (2, 2048)
    assert (part[:, ids] - full[:, ids]).abs().max() < 1e-4
    outside = torch.ones(2048, dtype=torch.bool)
    outside[ids] = False
    assert bool((part[:, outside] == OUTSIDE).all())
    # greedy rounds take the set's logits alone, and the same argmax
    only = _pass(reduced, tables, seqs, [0, 0], reduced=True)
    assert only.shape == (2, len(ids)) and torch.equal(only, part[:, ids])
    assert torch.equal(ids[only.max(-1).indices], part.max(-1).indices)
