"""The draft's grammar copy (compat/draft_grammar.py).

The worked example of structured output under sampled speculation, through vLLM's
real grammar (xgrammar via vLLM's backend) and its real truncation rule.

Three tokens A, B, C; the grammar allows A and B. The target (masked by the grammar)
is p = (.5, .5, 0); the draft's q = (0, .5, .5). vLLM's scheduler keeps only the
grammar-valid prefix of the drafts (``StructuredOutputGrammar.validate_tokens``) and
samples a cut position from p. Unmasked, the output is (.25, .75): the negative
control. With q masked by the plugin's grammar copy (``compat/draft_grammar.py``)
nothing is cut and the output is p.
"""

from __future__ import annotations

import types

import pytest
import torch

from vllm_specdec_plugin.rejection import rejection_sample

A, B, C = "}", " #", " The"
TRIALS, CHUNK = 8000, 2000


@pytest.fixture(scope="module")
def setup(ci_pair):
    pytest.importorskip("xgrammar")
    from transformers import AutoTokenizer
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    tok = AutoTokenizer.from_pretrained(str(ci_pair.target))
    ids = [tok.encode(t, add_special_tokens=False) for t in (A, B, C)]
    assert all(len(i) == 1 for i in ids), ids
    a, b, c = (i[0] for i in ids)
    cfg = types.SimpleNamespace(
        structured_outputs_config=types.SimpleNamespace(disable_any_whitespace=False),
        model_config=None, speculative_config=types.SimpleNamespace(num_speculative_tokens=1))
    backend = XgrammarBackend(cfg, tokenizer=tok, vocab_size=len(tok))
    grammar = backend.compile_grammar(StructuredOutputOptions.REGEX, r"(\}| #)")
    vocab = len(tok)
    p = torch.zeros(vocab)
    p[[a, b]] = 0.5
    q = torch.zeros(vocab)
    q[[b, c]] = 0.5
    return backend, grammar, (a, b, c), p, q


def _run(setup, masked: bool) -> torch.Tensor:
    """First output token of TRIALS independent rounds with k = 1. Returns counts [3]."""
    from vllm_specdec_plugin.compat.draft_grammar import RoundMasks

    backend, grammar, (a, b, c), p, q = setup
    if masked:
        masks = RoundMasks([grammar], backend.allocate_token_bitmask)
        logits = q.log().unsqueeze(0)
        masks.apply(logits, 0, torch.zeros((1, 1), dtype=torch.long))
        assert masks.finish() == [None]
        q = torch.softmax(logits[0], -1)
    gen = torch.Generator().manual_seed(11)
    torch.manual_seed(11)   # unseeded rows: standard rejection sampling, torch's default stream
    counts = torch.zeros(3, dtype=torch.long)
    for _ in range(TRIALS // CHUNK):
        x = torch.multinomial(q, CHUNK, replacement=True, generator=gen)          # drafts
        # vLLM's scheduler: keep the grammar-valid prefix of each row's drafts.
        kept = torch.tensor([len(grammar.validate_tokens([t])) for t in x.tolist()])
        # Flat layout: kept_b rows of q and kept_b + 1 rows of p per request.
        out, _ = rejection_sample(x.unsqueeze(1), kept, q.expand(int(kept.sum()), -1),
                                  p.expand(CHUNK, 2, -1)[torch.arange(2) < (kept + 1).unsqueeze(1)],
                                  torch.zeros(CHUNK, dtype=torch.bool))
        first = out[:, 0]
        counts += torch.stack([(first == t).sum() for t in (a, b, c)])
    return counts


def test_unmasked_drafts_are_cut_and_the_output_is_biased(setup):
    counts = _run(setup, masked=False)
    freq = counts.float() / TRIALS
    print(f"unmasked: A, B, C frequencies {freq.tolist()}")   # shown with -s
    assert counts[2] == 0
    assert abs(freq[0] - 0.25) < 0.03 and abs(freq[1] - 0.75) < 0.03, freq


def test_masked_drafts_are_never_cut_and_the_output_is_p(setup):
    from scipy.stats import chisquare

    counts = _run(setup, masked=True)
    print(f"masked: A, B, C frequencies {(counts.float() / TRIALS).tolist()}")
    assert counts[2] == 0
    assert chisquare(counts[:2].tolist(), [TRIALS / 2, TRIALS / 2]).pvalue > 1e-3, counts


def test_reasoning_gated_grammar_drafts_nothing():
    """With a reasoning parser gating the grammar, where reasoning ends is parser state
    the worker cannot mirror; structured requests then draft nothing (exact)."""
    from vllm_specdec_plugin.compat.draft_grammar import REASONING, DraftGrammars

    soc = types.SimpleNamespace(reasoning_parser="deepseek_r1", enable_in_reasoning=False)
    grammars = DraftGrammars(types.SimpleNamespace(structured_outputs_config=soc))
    assert grammars.ready("r", object(), None, 0, 0) == (None, REASONING)
    soc.enable_in_reasoning = True   # the grammar applies from the first token again
    assert not DraftGrammars(types.SimpleNamespace(structured_outputs_config=soc)).gated_by_reasoning
