"""All start-up checks of a plugin configuration, runnable before any engine starts.

Called from the config-creation wrapper (``compat/response_metrics.py``) in the
process that builds the VllmConfig (the API server, or the offline ``LLM``), so a bad
option, path or model pair stops start-up there with one message naming the fix,
before EngineCore and workers are spawned. The proposer repeats the same checks in
the worker (cheap), for engines built some other way.

Duck-typed on the VllmConfig; imports nothing from vLLM.
"""

from __future__ import annotations

from typing import Any

from vllm_specdec_plugin.config import (CONFIG_KEY, SpecDecConfig, from_vllm_config, merge_sources,
                                        resolve_dtype, selects_plugin)
from vllm_specdec_plugin.draft.checks import (check_draft_budget, check_draft_compatible,
                                              resolve_draft_path)


def check_vllm_config(vllm_config: Any) -> SpecDecConfig:
    """Raise a SpecDecError subclass unless the plugin can serve this configuration."""
    config = from_vllm_config(vllm_config)
    if config.method == "ngram":
        return config
    mc = vllm_config.model_config
    max_len = int(mc.max_model_len)
    draft = resolve_draft_path(config.draft_model)
    cfg = check_draft_compatible(draft, mc.hf_config, mc.tokenizer, mc.model, max_len,
                                 config.tokenizer_probe)
    check_draft_budget(cfg, resolve_dtype(config.draft_dtype, mc.dtype), config.block_size, config.draft_kv_cache_mib, max_len)
    return config


def check_engine_args(speculative_config: Any, additional_config: Any) -> SpecDecConfig | None:
    """Validate the plugin's options from raw engine arguments, before vLLM parses them.

    vLLM's own SpeculativeConfig validation would otherwise answer e.g. k = 0 with a
    pydantic error that names no fix. Returns None when the arguments do not select
    this plugin (then nothing is checked).
    """
    if not isinstance(speculative_config, dict):
        return None
    if not selects_plugin(speculative_config.get("method"), speculative_config.get("model")):
        return None
    k = speculative_config.get("num_speculative_tokens")
    extra = ((speculative_config.get("draft_load_config") or {})
             .get("model_loader_extra_config") or {}).get(CONFIG_KEY)
    additional = (additional_config or {}).get(CONFIG_KEY) if isinstance(additional_config, dict) else None
    return merge_sources(k, additional, extra)
