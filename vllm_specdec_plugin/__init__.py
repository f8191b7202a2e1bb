"""vllm-specdec-plugin: lossless draft-model speculative decoding for vLLM 0.32.

Users select it with::

    vllm serve TARGET --speculative-config '{"method": "custom_class",
        "model": "vllm_specdec_plugin.DraftModelProposer", "num_speculative_tokens": 4,
        "draft_load_config": {"model_loader_extra_config": {"specdec": {"draft_model": DRAFT}}}}'

Importing this package is cheap: nothing from vLLM or torch is imported until used.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

__all__ = ["register", "DraftModelProposer", "SUPPORTED_VLLM"]

from vllm_specdec_plugin.compat.version import SUPPORTED_VLLM  # noqa: E402

_registered = False

if TYPE_CHECKING:  # pragma: no cover
    from vllm_specdec_plugin.proposer import DraftModelProposer


def register() -> None:
    """vLLM general-plugin entry point (group ``vllm.general_plugins``), called once per
    process before the model runner is built. Idempotent and cheap: checks the vLLM
    version and installs the ``frontend``, ``config`` and ``engine`` rows of
    ``compat.patches`` (pass-throughs unless our proposer is configured); the ``worker``
    rows come only with our proposer, so an unselected plugin changes nothing."""
    global _registered
    if _registered:
        return
    from vllm_specdec_plugin.compat.version import check_vllm_version

    check_vllm_version()
    from vllm_specdec_plugin.compat import patches

    for group in ("frontend", "config", "engine"):  # see compat.patches for each
        patches.install(group)
    _registered = True
    _trace_registration()


def _trace_registration() -> None:
    """One JSON line per process to $SPECDEC_REGISTER_TRACE, if set (where it loaded)."""
    path = os.environ.get("SPECDEC_REGISTER_TRACE")
    if not path:
        return
    import multiprocessing
    import sys

    rec = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "process": multiprocessing.current_process().name,
        "argv0": os.path.basename(sys.argv[0]) if sys.argv else "",
        "engine_core_loaded": "vllm.v1.engine.core" in sys.modules,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def __getattr__(name: str) -> Any:
    # Lazy export so `import vllm_specdec_plugin` never pulls in torch or vLLM.
    if name == "DraftModelProposer":
        from vllm_specdec_plugin.proposer import DraftModelProposer

        return DraftModelProposer
    raise AttributeError(name)
