"""A draft whose tokenizer disagrees with the target's stops engine start-up with
one clear error naming the fix."""

import json
import shutil

import pytest

from harness import EngineFailed, engine_kwargs, plugin_spec, run_engine
from vllm_specdec_plugin.tuning import TOKENIZER_PROBE


def _swap_two_probe_tokens(folder):
    """Same vocab size and specials, but two ids of tokens in the probe exchanged."""
    from transformers import AutoTokenizer

    probe = TOKENIZER_PROBE
    ids = AutoTokenizer.from_pretrained(str(folder)).encode(probe, add_special_tokens=False)
    a, b = ids[0], next(i for i in ids if i != ids[0])
    tj = folder / "tokenizer.json"
    data = json.loads(tj.read_text())
    vocab = data["model"]["vocab"]
    inv = {v: k for k, v in vocab.items()}
    vocab[inv[a]], vocab[inv[b]] = b, a
    tj.write_text(json.dumps(data))


def test_mismatched_tokenizer_fails_clearly(ci_pair, tmp_path):
    bad = tmp_path / "draft"
    shutil.copytree(ci_pair.draft, bad)
    _swap_two_probe_tokens(bad)
    with pytest.raises(EngineFailed) as e:
        run_engine(engine_kwargs(ci_pair.target, plugin_spec(bad, 3)),
                   [{"name": "x", "prompts": ["a"], "params": {"max_tokens": 2}}], timeout=300)
    assert "draft and target tokenizers disagree on the probe string" in e.value.output
    assert "Fix: the draft must use the target's tokenizer" in e.value.output
