"""Engine-config creation: where the plugin's start-up work happens, once, in the
process that builds the VllmConfig (the API server, or the offline ``LLM``).

Why and how: the ``EngineArgs.create_engine_config`` row of ``compat.patches``.
"""

from __future__ import annotations

from typing import Any


def wrap_create_engine_config(original: Any) -> Any:
    def create_engine_config(self, *args, **kwargs):  # noqa: ANN001 - vLLM signature
        from vllm_specdec_plugin.startup_checks import check_engine_args

        check_engine_args(getattr(self, "speculative_config", None),
                          getattr(self, "additional_config", None))
        config = original(self, *args, **kwargs)
        if not _selects_plugin(config):
            return config
        _on_plugin_config(config)
        return config

    return create_engine_config


def _selects_plugin(config: Any) -> bool:
    from vllm_specdec_plugin.compat.rejection_adapter import is_ours

    return is_ours(getattr(config, "speculative_config", None))


def _on_plugin_config(config: Any) -> None:
    from vllm_specdec_plugin import ray_bridge
    from vllm_specdec_plugin.compat import patches
    from vllm_specdec_plugin.startup_checks import check_vllm_config

    # Fail here, before EngineCore and workers exist: one message naming the fix.
    level = check_vllm_config(config).response_metrics
    obs = getattr(config, "observability_config", None)
    if obs is not None and obs.per_request_spec_decode_metrics == "none" and level != "none":
        obs.per_request_spec_decode_metrics = level
    patches.install("responses")
    ray_bridge.maybe_start()  # Ray Serve replicas only
