"""The reduced draft vocabulary: its file, its ranking, and what the sampling pipeline
makes of the logits outside it (no mass beside an in-set token, never NaN)."""

import json

import pytest
import torch

from vllm_specdec_plugin.draft_vocab import OUTSIDE, load, main, ranking
from vllm_specdec_plugin.errors import SpecDecConfigError
from vllm_specdec_plugin.sampling.pipeline import SamplingSpec, target_probs


def test_load_sorts_and_takes_both_forms(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([5, 1, 3]))
    b.write_text(json.dumps({"ids": [5, 1, 3], "size": 3}))
    for p in (a, b):
        assert load(p, 8).tolist() == [1, 3, 5]


@pytest.mark.parametrize("content,match", [
    (None, "does not exist"), ("{", "not readable JSON"), ("[]", "non-empty list"),
    ('["a"]', "integer token ids"), ("[1, 9]", "outside the vocabulary"),
    ("[1, 1]", "repeats")])
def test_load_errors_name_the_fix(tmp_path, content, match):
    p = tmp_path / "v.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(SpecDecConfigError, match=match) as e:
        load(p, 8)
    assert "Fix:" in str(e.value)


def test_ranking_keeps_specials_then_most_frequent():
    ids, cover = ranking([[1, 2, 2, 3, 3, 3], [4, 2]], 3, always=[7])
    assert ids == [7, 2, 3]                   # 2 and 3 tie (3 each): lower id first
    assert cover == pytest.approx(6 / 8)      # 3 x3 and 2 x3 of 8 counted tokens
    assert ranking([[2, 1]], 5)[0] == [1, 2]  # fewer distinct tokens than size


@pytest.mark.parametrize("spec", [SamplingSpec(temperature=1e-5 * 1.01), SamplingSpec(temperature=1.0),
                                  SamplingSpec(temperature=2.0, top_k=3),
                                  SamplingSpec(temperature=1.0, repetition_penalty=2.0)])
def test_outside_logits_get_no_mass(spec):
    logits = torch.full((1, 8), OUTSIDE)
    logits[0, [1, 4, 6]] = torch.tensor([-30.0, 2.0, 40.0])
    q = target_probs(logits, [spec], [[4]], [[1, 6]])
    assert torch.isfinite(q).all() and float(q.sum()) == pytest.approx(1.0)
    assert float(q[0, [0, 2, 3, 5, 7]].sum()) == 0.0


def test_only_outside_tokens_allowed_gives_a_distribution_not_nan():
    """A grammar (or allowed ids) that admits no in-set token: q is uniform over the
    admitted outside tokens, a valid proposal (the target's p decides)."""
    logits = torch.full((1, 8), OUTSIDE)
    logits[0, [1, 4]] = 3.0
    logits[0, [1, 4, 5]] = float("-inf")      # the mask: only 0, 2, 3, 6, 7 allowed
    q = target_probs(logits, [SamplingSpec(temperature=0.7)], [[]], [[]])
    assert torch.isfinite(q).all()
    assert q[0, [0, 2, 3, 6, 7]].tolist() == pytest.approx([0.2] * 5)


def test_command_writes_a_loadable_file(tmp_path, ci_pair):
    corpus = tmp_path / "c.json"
    corpus.write_text(json.dumps([{"conversations": [{"from": "human", "value": "def f(x):"},
                                                     {"from": "gpt", "value": "return x"}]}]))
    out = tmp_path / "v.json"
    assert main(["--tokenizer", str(ci_pair.target), "--corpus", str(corpus), "--size", "16",
                 "--out", str(out)]) == 0
    meta = json.loads(out.read_text())
    assert meta["size"] == len(meta["ids"]) <= 16 and meta["coverage"] > 0
    assert len(load(out, 2048)) == meta["size"]
