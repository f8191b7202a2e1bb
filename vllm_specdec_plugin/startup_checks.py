"""All start-up checks of a plugin configuration, runnable before any engine starts.

Called from the config-creation wrapper (``compat/engine_config.py``) in the process
that builds the VllmConfig, so a bad option, path or model pair stops start-up there
with one message naming the fix, before EngineCore and workers are spawned; the
proposer repeats them in the worker, for engines built some other way. Duck-typed on
the VllmConfig; imports nothing from vLLM.
"""

from __future__ import annotations

from typing import Any

from vllm_specdec_plugin import draft_vocab
from vllm_specdec_plugin.config import (CONFIG_KEY, SpecDecConfig, from_vllm_config, merge_sources,
                                        resolve_dtype, selects_plugin)
from vllm_specdec_plugin.draft.checks import (check_draft_budget, check_draft_compatible,
                                              resolve_draft_path)
from vllm_specdec_plugin.errors import UnsupportedFeatureError
from vllm_specdec_plugin.tuning import BLOCK_SIZE, TOKENIZER_PROBE

# vLLM's entry-point group for installed logits-processor plugins.
LOGITS_PROCESSOR_GROUP = "vllm.logits_processors"


def check_vllm_config(vllm_config: Any) -> SpecDecConfig:
    """Raise a SpecDecError subclass unless the plugin can serve this configuration."""
    config = from_vllm_config(vllm_config)
    check_features(vllm_config)
    if config.method == "ngram":
        return config
    mc = vllm_config.model_config
    max_len = int(mc.max_model_len)
    draft = resolve_draft_path(config.draft_model)
    cfg = check_draft_compatible(draft, mc.hf_config, mc.tokenizer, mc.model, max_len,
                                 TOKENIZER_PROBE)
    check_draft_budget(cfg, resolve_dtype(mc.dtype), BLOCK_SIZE, config.draft_kv_cache_mib, max_len)
    if config.draft_vocab:
        draft_vocab.load(config.draft_vocab, int(cfg["vocab_size"]))
    return config


def check_engine_args(speculative_config: Any, additional_config: Any) -> SpecDecConfig | None:
    """Validate the plugin's options from raw engine arguments before vLLM parses them
    (its pydantic error for e.g. k = 0 names no fix); None when they do not select the
    plugin."""
    if not isinstance(speculative_config, dict):
        return None
    if not selects_plugin(speculative_config.get("method"), speculative_config.get("model")):
        return None
    k = speculative_config.get("num_speculative_tokens")
    extra = ((speculative_config.get("draft_load_config") or {})
             .get("model_loader_extra_config") or {}).get(CONFIG_KEY)
    additional = (additional_config or {}).get(CONFIG_KEY) if isinstance(additional_config, dict) else None
    return merge_sources(k, additional, extra)


def check_features(vllm_config: Any) -> None:
    """Refuse the vLLM features speculation with this plugin cannot serve exactly (each
    message says why and names the fix)."""
    pc = vllm_config.parallel_config
    scale = ("Fix: serve with --tensor-parallel-size 1 --pipeline-parallel-size 1 and scale "
             "out with one replica per device (deploy/ray), or serve without the plugin.")
    if int(getattr(pc, "tensor_parallel_size", 1) or 1) > 1:
        raise UnsupportedFeatureError(
            "tensor parallelism is not supported with the specdec plugin: every rank would "
            f"load the whole draft and its KV pool, unsharded. {scale}")
    if int(getattr(pc, "pipeline_parallel_size", 1) or 1) > 1:
        raise UnsupportedFeatureError(
            "pipeline parallelism is not supported with the specdec plugin: the proposer "
            f"runs beside the first stage but needs the last stage's tokens. {scale}")
    if int(getattr(pc, "data_parallel_size", 1) or 1) > 1:
        raise UnsupportedFeatureError(
            "data parallelism (--data-parallel-size > 1) is not supported with the specdec "
            "plugin (untested). Fix: run one server per replica behind a router "
            "(deploy/ray does this), or serve without the plugin.")
    if getattr(vllm_config, "lora_config", None) is not None:
        raise UnsupportedFeatureError(
            "LoRA adapters are not supported with the specdec plugin: the draft has no "
            "adapter and the combination is untested. Fix: serve without --enable-lora, or "
            "merge the adapter into the target's weights.")
    procs = [str(x) for x in (getattr(vllm_config.model_config, "logits_processors", None) or ())]
    procs += [ep.value for ep in _installed_logits_processors()]
    if procs:
        raise UnsupportedFeatureError(
            f"custom logits processors ({', '.join(procs)}) are not supported with the specdec "
            "plugin: on a speculative step each would have to run once per draft position "
            "with that position's history, which their API cannot express, so the output "
            "would no longer be the target's. Fix: serve without --logits-processors (and "
            f"uninstall packages registering '{LOGITS_PROCESSOR_GROUP}' entry points), or "
            "serve without the plugin.")


def _installed_logits_processors() -> list[Any]:
    from importlib.metadata import entry_points

    return list(entry_points(group=LOGITS_PROCESSOR_GROUP))
