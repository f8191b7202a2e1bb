"""Start-up compatibility checks of a draft against a target, one clear error each."""

import json
import os
import shutil
from types import SimpleNamespace

import pytest

from vllm_specdec_plugin.draft.checks import check_draft_compatible, resolve_draft_path
from vllm_specdec_plugin.errors import DraftCompatibilityError, SpecDecConfigError


@pytest.fixture()
def pair(ci_pair, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(ci_pair.draft, draft)
    cfg = json.loads((ci_pair.target / "config.json").read_text())
    return draft, SimpleNamespace(**cfg), str(ci_pair.target)


def _edit(folder, **changes):
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    cfg.update(changes)
    p.write_text(json.dumps(cfg))


def _check(draft, hf, target, max_len=512):
    return check_draft_compatible(draft, hf, target, target, max_len, "def f(x):\n    return x")


def test_compatible_pair_passes(pair):
    assert _check(*pair)["vocab_size"] == 2048


@pytest.mark.parametrize("changes,match", [
    ({"vocab_size": 4096}, "draft vocab_size 4096 != target vocab_size 2048"),
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "architecture GPT2LMHeadModel"),
    ({"max_position_embeddings": 256}, r"max_position_embeddings 256 < served max_model_len 512.*--max-model-len 256"),
])
def test_config_mismatches(pair, changes, match):
    draft, hf, target = pair
    _edit(draft, **changes)
    with pytest.raises(DraftCompatibilityError, match=match):
        _check(draft, hf, target)


def test_eos_mismatch(pair):
    draft, hf, target = pair
    _edit(draft, eos_token_id=7)
    gen = draft / "generation_config.json"
    g = json.loads(gen.read_text())
    g["eos_token_id"] = 7
    gen.write_text(json.dumps(g))
    with pytest.raises(DraftCompatibilityError, match=r"EOS token ids \[7\] share none"):
        _check(draft, hf, target)


def test_missing_and_unreadable_paths(tmp_path):
    with pytest.raises(SpecDecConfigError, match="does not exist"):
        resolve_draft_path(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecDecConfigError, match="has no config.json"):
        resolve_draft_path(str(tmp_path / "empty"))
    f = tmp_path / "file.bin"
    f.write_text("x")
    with pytest.raises(SpecDecConfigError, match="is a file, not a model folder"):
        resolve_draft_path(str(f))
    if os.geteuid() != 0:  # root reads everything; the permission check cannot trigger
        locked = tmp_path / "locked"
        locked.mkdir()
        os.chmod(locked, 0)
        with pytest.raises(SpecDecConfigError, match="not readable"):
            resolve_draft_path(str(locked))
