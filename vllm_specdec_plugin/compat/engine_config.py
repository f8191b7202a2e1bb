"""Engine-config creation: where the plugin's start-up work happens, once, in the
process that builds the VllmConfig (the API server, or the offline ``LLM``).

Why: a bad plugin configuration must stop start-up with one message naming the fix
  before EngineCore and workers are spawned; vLLM has no plugin hook at config
  creation. The same moment is the right one to turn on per-request acceptance in
  responses and to start the Ray Serve metrics bridge.
How: ``EngineArgs.create_engine_config`` is wrapped (from ``register()``, in every
  process). Before vLLM parses the speculative config, ``startup_checks.check_engine_args``
  validates our options (vLLM's pydantic error for k = 0 names no fix); after, when the
  config selects our proposer: ``startup_checks.check_vllm_config`` (draft folder, pair,
  KV budget), ``--per-request-spec-decode-metrics`` defaults to the plugin's level,
  the response wrappers are installed (``response_metrics``) and, in a Ray Serve
  replica, the metrics bridge starts (``ray_bridge``). Otherwise a pure pass-through.
Upstream: a plugin hook on engine-config creation (or config validation).
Remove when: vLLM offers one; the three steps move there unchanged.
"""

from __future__ import annotations

from typing import Any

_installed = False


def install() -> None:
    """Wrap EngineArgs.create_engine_config (idempotent)."""
    global _installed
    if _installed:
        return
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config

    def create_engine_config(self, *args, **kwargs):  # noqa: ANN001 - vLLM signature
        from vllm_specdec_plugin.startup_checks import check_engine_args

        check_engine_args(getattr(self, "speculative_config", None),
                          getattr(self, "additional_config", None))
        config = original(self, *args, **kwargs)
        if not _selects_plugin(config):
            return config
        _on_plugin_config(config)
        return config

    create_engine_config.__wrapped__ = original  # type: ignore[attr-defined]
    EngineArgs.create_engine_config = create_engine_config
    _installed = True


def _selects_plugin(config: Any) -> bool:
    from vllm_specdec_plugin.compat.rejection_adapter import is_ours

    return is_ours(getattr(config, "speculative_config", None))


def _on_plugin_config(config: Any) -> None:
    from vllm_specdec_plugin import ray_bridge
    from vllm_specdec_plugin.compat import response_metrics
    from vllm_specdec_plugin.startup_checks import check_vllm_config

    # Fail here, before EngineCore and workers exist: one message naming the fix.
    level = check_vllm_config(config).response_metrics
    obs = getattr(config, "observability_config", None)
    if obs is not None and obs.per_request_spec_decode_metrics == "none" and level != "none":
        obs.per_request_spec_decode_metrics = level
    response_metrics.install_response_wrappers()
    ray_bridge.maybe_start()  # Ray Serve replicas only
