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

SUPPORTED_VLLM = "0.32"  # major.minor this release is written and tested against

_registered = False

if TYPE_CHECKING:  # pragma: no cover
    from vllm_specdec_plugin.proposer import DraftModelProposer


def register() -> None:
    """vLLM general-plugin entry point (group ``vllm.general_plugins``).

    vLLM calls this once per process (API server, EngineCore, workers) before the
    model runner is built. It is idempotent and cheap: it checks the vLLM version and
    installs pass-through wrappers that act only when our proposer is configured:
    request validation and config creation (on configs selecting it), the
    EngineCore half of ``compat.draft_ids_return`` (on model outputs that our
    proposer's worker marked), ``compat.request_scope`` and ``compat.scheduler_plan``
    (on schedulers whose config selects our proposer). Every other patch of vLLM
    internals is installed later, and only when our proposer is actually configured
    (see ``compat``), so an installed but unselected plugin changes nothing.
    """
    global _registered
    if _registered:
        return
    from vllm_specdec_plugin.compat.version import check_vllm_version

    check_vllm_version()
    from vllm_specdec_plugin.compat import rejection_adapter

    # Frontend (API process): request validation refuses min_p/logit_bias under any
    # speculation. The wrapper is a pass-through unless our proposer is configured.
    rejection_adapter.install_frontend_patch()
    # Config creation: start-up checks, per-request acceptance on by default, Ray
    # bridge; all only when a config selects our proposer.
    from vllm_specdec_plugin.compat import engine_config

    engine_config.install()
    # EngineCore (its own process under `vllm serve`, where nothing else of ours runs):
    # drafts that came with the step's output skip post_step's extra RPC.
    from vllm_specdec_plugin.compat import draft_ids_return

    draft_ids_return.install_engine()
    # EngineCore: each new request's cache_salt and the step's aborted ids reach the
    # worker, so cross-request drafting stays within a tenant (``tenancy``).
    from vllm_specdec_plugin.compat import request_scope

    request_scope.install_engine()
    # EngineCore: waiting prefills come before drafts (``step_plan``).
    from vllm_specdec_plugin.compat import scheduler_plan

    scheduler_plan.install_engine()
    _registered = True
    _trace_registration()


def _trace_registration() -> None:
    """Append one JSON line per process to $SPECDEC_REGISTER_TRACE, if set.

    Lets tests and operators see in which processes the plugin was loaded.
    """
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
