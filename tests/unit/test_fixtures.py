"""The fixture-model builder: determinism, loadability, manifest, cache API.

The ci pair is built twice, each time in a fresh interpreter (so per-process hash
seeds, thread pools and allocator state differ), into two temporary roots.
About a minute in total on 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PROBE = 'def f(x):\n\treturn {"héllo": x ** 2}  # ✓ 世界 \\n\r\n'


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree_hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): _sha256(p)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _build_in_subprocess(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("SPECDEC_FIXTURES_DIR", None)
    p = subprocess.run([sys.executable, "-m", "specdec_fixtures", "--pair", "ci",
                        "--root", str(root)], cwd=str(REPO), env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return p


@pytest.fixture(scope="module")
def two_ci_builds(tmp_path_factory):
    roots = [tmp_path_factory.mktemp("fixtures_a"), tmp_path_factory.mktemp("fixtures_b")]
    outs = [_build_in_subprocess(r) for r in roots]
    return roots, outs


@pytest.fixture(scope="module")
def ci_pair(two_ci_builds):
    from specdec_fixtures import ensure_pair

    return ensure_pair("ci", root=two_ci_builds[0][0])  # already built: just loads


def test_ci_build_is_deterministic(two_ci_builds):
    from specdec_fixtures import BUILDER_VERSION
    from specdec_fixtures.build import VOLATILE_MANIFEST_KEYS
    from specdec_fixtures.layout import MANIFEST_NAME

    (a, b), _ = two_ci_builds
    da, db = a / f"v{BUILDER_VERSION}" / "ci", b / f"v{BUILDER_VERSION}" / "ci"
    ha, hb = _tree_hashes(da), _tree_hashes(db)
    assert sorted(ha) == sorted(hb)
    assert {"draft/model.safetensors", "target/model.safetensors", "draft/tokenizer.json",
            "target/config.json", "target/generation_config.json", MANIFEST_NAME} <= set(ha)
    differ = [k for k in ha if ha[k] != hb[k] and k != MANIFEST_NAME]
    assert not differ, f"files differ between two builds: {differ}"
    # The manifest differs only in measured wall-clock times.
    ma, mb = (json.loads((d / MANIFEST_NAME).read_text()) for d in (da, db))
    for k in VOLATILE_MANIFEST_KEYS:
        ma.pop(k), mb.pop(k)
    assert ma == mb
    # Target and draft share one tokenizer, byte for byte.
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert ha[f"draft/{f}"] == ha[f"target/{f}"]


def test_cli_prints_progress_and_paths(two_ci_builds):
    (a, _), (out, _) = two_ci_builds
    text = out.stdout
    for stage in ("[corpus+tokenizer]", "[draft train]", "[construct target]", "[choose eps]"):
        assert stage in text
    assert "step  150/150" in text or "step 150/150" in text
    assert str(a) in text and "ci.target" in text and "ci.draft" in text


def test_transformers_loads_ci_pair_and_tokenizer_round_trips(ci_pair):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = ci_pair.manifest
    ids = {k: m["tokenizer"][k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    models = {}
    for role in ("target", "draft"):
        folder = getattr(ci_pair, role)
        cfg = json.loads((folder / "config.json").read_text())
        gen = json.loads((folder / "generation_config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"]
        assert cfg["vocab_size"] == 2048 and cfg["max_position_embeddings"] == 2048
        assert cfg["tie_word_embeddings"] is False and cfg["rope_theta"] == 10000.0
        assert cfg["torch_dtype"] == cfg["dtype"] == "float32"
        for k, v in ids.items():
            assert cfg[k] == v and gen[k] == v

        tok = AutoTokenizer.from_pretrained(str(folder))
        assert (tok.bos_token, tok.eos_token) == ("<|begin|>", "<|end|>")
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
            ids["bos_token_id"], ids["eos_token_id"], ids["pad_token_id"])
        assert tok.unk_token is not None and len(tok) == 2048
        enc = tok(PROBE).input_ids
        assert enc[0] == ids["bos_token_id"] and ids["bos_token_id"] not in enc[1:]
        assert tok.decode(enc, skip_special_tokens=True) == PROBE
        assert tok.decode(tok(PROBE, add_special_tokens=False).input_ids) == PROBE

        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        assert type(model).__name__ == "LlamaForCausalLM"
        assert model.dtype == torch.float32
        assert sum(p.numel() for p in model.parameters()) == m[role]["params"]
        with torch.inference_mode():
            logits = model(torch.tensor([enc])).logits
        assert logits.shape == (1, len(enc), 2048) and torch.isfinite(logits).all()
        models[role] = (model, logits)

    # Target = draft + O(eps): their greedy choices agree on most positions.
    agree = (models["target"][1].argmax(-1) == models["draft"][1].argmax(-1)).float().mean()
    assert agree > 0.3


def test_manifest_matches_files_on_disk(ci_pair):
    import torch

    from specdec_fixtures import BUILDER_VERSION
    from specdec_fixtures.layout import MANIFEST_NAME
    from specdec_fixtures.corpus import load_corpus

    m = ci_pair.manifest
    assert ci_pair.path.name == "ci" and ci_pair.path.parent.name == f"v{BUILDER_VERSION}"
    assert m["builder_version"] == BUILDER_VERSION and m["pair"] == "ci"
    on_disk = {k: v for k, v in _tree_hashes(ci_pair.path).items() if k != MANIFEST_NAME}
    assert {k: v["sha256"] for k, v in m["files"].items()} == on_disk
    for rel, info in m["files"].items():
        assert (ci_pair.path / rel).stat().st_size == info["bytes"]

    assert m["environment"]["python"] == sys.version.split()[0]
    assert m["environment"]["torch"] == torch.__version__
    assert m["corpus"]["sha256"] == load_corpus().digest
    assert m["num_threads"] == 2
    lo, hi = m["agreement"]["target_range"]
    assert lo <= m["agreement"]["value"] <= hi and m["agreement"]["in_range"]
    assert m["agreement"]["eps0_agreement"] > 0.99
    assert 0 < m["eps"] < 64
    assert m["target"]["params"] > 2 * m["draft"]["params"]
    assert m["spec"]["target"]["num_hidden_layers"] == 4
    assert m["spec"]["draft"]["hidden_size"] == 128
    for role in ("draft", "target"):
        assert m["timings"][f"{role}_decode_ms_float32"] > 0
    assert m["draft"]["heldout_loss"] < m["draft"]["heldout_loss_warm_start"]


def test_cache_reuse_and_incomplete_detection(two_ci_builds, tmp_path):
    import shutil

    from specdec_fixtures import load_pair, pair_dir
    from specdec_fixtures.build import _ensure

    root = two_ci_builds[0][0]
    pair, built = _ensure("ci", root, False, lambda s: None)
    assert not built and pair.target.is_dir() and pair.draft.is_dir()
    assert pair_dir("ci", root) == pair.path

    # A copy with a truncated weight file (or no manifest) is not a complete pair.
    copy = tmp_path / "ci"
    shutil.copytree(pair.path, copy)
    assert load_pair(copy) is not None
    w = copy / "target" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    assert load_pair(copy) is None
    (copy / "manifest.json").unlink()
    assert load_pair(copy) is None


def test_fixtures_root_resolution(monkeypatch, tmp_path):
    from specdec_fixtures import BUILDER_VERSION, fixtures_root, pair_dir

    monkeypatch.setenv("SPECDEC_FIXTURES_DIR", str(tmp_path / "x"))
    assert fixtures_root() == tmp_path / "x"
    assert pair_dir("ci") == tmp_path / "x" / f"v{BUILDER_VERSION}" / "ci"
    monkeypatch.delenv("SPECDEC_FIXTURES_DIR")
    assert fixtures_root() == REPO / ".cache" / "fixtures"


def test_import_is_cheap():
    code = ("import sys, specdec_fixtures as f; "
            "heavy = [m for m in ('torch', 'tokenizers', 'transformers', 'safetensors') "
            "if m in sys.modules]; assert not heavy, heavy; print(f.BUILDER_VERSION)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_constructed_target_equals_draft_at_eps_zero():
    """Widening (incl. a GQA group-size change 2 -> 3) and deepening preserve the
    draft's function exactly when eps = 0, and eps > 0 perturbs it."""
    import torch

    from specdec_fixtures.checkpoint import llama_config_dict, make_hf_model
    from specdec_fixtures.construct import construct_target
    from specdec_fixtures.specs import ModelSpec

    draft = ModelSpec(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96)
    target = ModelSpec(hidden_size=192, num_hidden_layers=3, num_attention_heads=12,
                       num_key_value_heads=4, intermediate_size=200)
    ids = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3}
    g = torch.Generator().manual_seed(0)
    dcfg = llama_config_dict(draft, dtype="float32", special_ids=ids)
    dmodel = make_hf_model(dcfg)
    with torch.no_grad():
        for n, p in dmodel.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim > 1 else 1.0)
                    + (1.0 if p.ndim == 1 else 0.0))
    dsd = {k: v.clone() for k, v in dmodel.state_dict().items()}
    cons = construct_target(dsd, draft, target, draft_rms_norm_eps=dcfg["rms_norm_eps"], seed=1)
    tcfg = llama_config_dict(target, dtype="float32", special_ids=ids,
                             rms_norm_eps=cons.rms_norm_eps)
    x = torch.randint(4, 2048, (2, 40), generator=g)
    with torch.inference_mode():
        ref = dmodel(x).logits
        t0 = make_hf_model(tcfg, cons.state_dict(0.0))(x).logits
        t1 = make_hf_model(tcfg, cons.state_dict(0.5))(x).logits
    assert torch.allclose(t0, ref, atol=1e-4, rtol=1e-4), (t0 - ref).abs().max()
    assert (t1 - ref).abs().max() > 1e-2
