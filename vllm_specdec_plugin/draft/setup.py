"""Loading the draft model: weights through vLLM, its KV pool, the warm-up passes."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from vllm_specdec_plugin.compat import draft_model
from vllm_specdec_plugin.draft.checks import check_draft_budget
from vllm_specdec_plugin.draft.round import run_round
from vllm_specdec_plugin.draft.sampler import DraftSampler
from vllm_specdec_plugin.kv import BlockAllocator
from vllm_specdec_plugin.planning import Plan
from vllm_specdec_plugin.request_state import RequestState
from vllm_specdec_plugin.tuning import BLOCK_SIZE
from vllm_specdec_plugin.vocab_memory import describe as describe_buffers
from vllm_specdec_plugin.vocab_memory import vocab_buffers

logger = logging.getLogger("vllm.specdec_plugin")


def load_draft(vllm_config: Any, config: Any, draft_path: Any, draft_hf_config: dict,
               dtype: torch.dtype, dtype_name: str, device: torch.device, max_model_len: int,
               vocab_size: int, vocab_ids: torch.Tensor | None = None,
               ) -> tuple[draft_model.DraftKernels, BlockAllocator]:
    """The draft's kernels and a block allocator over its KV pool
    (``config.draft_kv_cache_mib``, whole blocks), compiled and warmed; logs both.
    ``vocab_ids`` (int64 [N]): the reduced draft vocabulary (``draft_vocab``), or None."""
    bs = BLOCK_SIZE
    num_blocks = check_draft_budget(draft_hf_config, dtype_name, bs, config.draft_kv_cache_mib,
                                    max_model_len)
    t0 = time.perf_counter()
    kernels = draft_model.load(vllm_config, draft_path, bs, num_blocks, dtype, device,
                               vocab_ids, vocab_size)
    allocator = BlockAllocator(kernels.num_blocks, bs)
    weights = sum(t.numel() * t.element_size() for t in kernels.model.parameters())
    warm_up(kernels, allocator, max_model_len, vocab_size, device)
    head = "" if kernels.head is None else (
        f", reduced head {kernels.head.shape[0]} of {vocab_size} tokens "
        f"{kernels.head.numel() * kernels.head.element_size() / 2**20:.1f} MiB")
    logger.info(
        "specdec: draft %s (%s, %s) on %s, backend %s, %s; weights %.1f MiB%s, draft KV "
        "%d blocks x %d tokens = %.1f MiB (reserved before the target's KV is sized); "
        "loaded and warmed in %.1f s", draft_path, type(kernels.model).__name__,
        str(dtype).removeprefix("torch."), device, kernels.backend_name,
        "compiled" if kernels.compiled else "eager", weights / 2**20, head,
        allocator.num_blocks, bs, kernels.kv_bytes / 2**20, time.perf_counter() - t0)
    return kernels, allocator


def warm_up(kernels: draft_model.DraftKernels, allocator: BlockAllocator, max_model_len: int,
            vocab_size: int, device: torch.device) -> None:
    """Run a varlen pass and a decode pass so torch.compile compiles now, in
    load_model, never while serving. Writes only free blocks (nothing is cached)."""
    bs, n = allocator.block_size, allocator.num_blocks
    rows = []
    for length, k in ((min(2 * bs + 3, max_model_len - 3), 2), (1, 2)):
        req = RequestState()
        req.table.blocks = [i % n for i in range(-(-(length + k) // bs))]
        rows.append(Plan(row=0, req_id="warmup", req=req, new_tokens=[0] * length,
                         length=length, k=k))
    sampler = DraftSampler([None, None], [[], []], [[], []], [None, None], 2, vocab_size, device)
    run_round(kernels, rows, sampler, device)


def log_vocab_buffers(vllm_config: Any, k: int, vocab_size: int, uses_model: bool) -> None:
    """Log the per-step vocabulary buffers at max_num_seqs x k x V (``vocab_memory``):
    vLLM's KV sizing does not reserve them."""
    max_rows = int(getattr(vllm_config.scheduler_config, "max_num_seqs", 0) or 0)
    item = torch.empty((), dtype=vllm_config.model_config.dtype).element_size()
    vocab = vocab_buffers(max_rows, k, vocab_size, item, uses_model)
    logger.info("specdec: per-step vocabulary buffers at %d requests x k %d x V %d: %s",
                max_rows, k, vocab_size, describe_buffers(vocab))
