"""A vLLM config and process state for driving the proposer without an engine
(tests only; not in the wheel).

Why: proposer-level tests feed ``propose`` hand-made batches and compare drafts with
  a reference model. Since the draft runs on vLLM's model classes, loading it needs
  what a worker process sets up: a VllmConfig, vLLM's distributed state (world size
  1), the IR-op priorities, and on CPU the accelerator no-op the CPU runner installs.
How: ``EngineArgs(...).create_engine_config()`` for the config, then the same calls
  ``CPUWorker.init_device`` / ``WorkerBase`` make (shared/docs/draft-on-vllm-kernels.md,
  "Standalone scripts"). Idempotent per process.
Upstream: none; this mirrors worker start-up.
Remove when: the worker start-up sequence changes (tests fail loudly then).
"""

from __future__ import annotations

import socket
from typing import Any

_initialised = False


def vllm_config(target: str, speculative_config: dict | None = None, **engine_args: Any) -> Any:
    """A VllmConfig as an engine would build it, with this process set up to load models."""
    from vllm.engine.arg_utils import EngineArgs

    args = dict(model=target, dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    args.update(engine_args)
    cfg = EngineArgs(speculative_config=speculative_config, **args).create_engine_config()
    _init_process(cfg)
    return cfg


def _init_process(cfg: Any) -> None:
    global _initialised
    if _initialised:
        return
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop

        _set_torch_accelerator_to_noop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(cfg):
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0,
                                     "gloo" if current_platform.is_cpu() else "nccl")
        ensure_model_parallel_initialized(1, 1)
    cfg.kernel_config.ir_op_priority.set_default()
    _initialised = True
