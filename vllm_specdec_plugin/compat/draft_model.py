"""Run the draft through vLLM's own model class and attention backend, over KV
tensors and block tables the plugin owns.

Why: the draft must run vLLM's kernels (any registered decoder architecture, the
  platform's paged attention, torch.compile/CUDA graphs) without joining the target's
  KV cache: the plugin keeps its own allocator, block tables, rollback-by-trim and
  lazy prefill. vLLM 0.32 has no public API for "a second model on its own KV".
How (verified hook map: shared/docs/draft-on-vllm-kernels.md):
  - a private ``VllmConfig`` (``dataclasses.replace``) with the draft ``ModelConfig``, a
    *copy* of the ``CompilationConfig`` (its ``static_forward_context`` is
    ``init=False``: an empty layer registry, so the draft's attention layers never join
    the target's) and a ``CacheConfig`` copy with the draft block size;
  - ``get_model`` under ``set_model_tag`` (its own compile cache), as the in-tree
    ``draft_model`` proposer does;
  - KV in the backend's layout through vLLM's allocator path (``get_kv_cache_groups`` ->
    ``get_kv_cache_config_from_groups`` -> ``allocate_kv_cache``), bound with
    ``Attention.bind_kv_cache``;
  - per pass, ``CommonAttentionMetadata`` from the plugin's block tables, the backend's
    metadata builder (built with the draft config, where it looks layers up), and
    ``set_forward_context`` with the draft config and a per-layer ``slot_mapping`` dict
    (without it no KV is written, silently);
  - a reduced draft vocabulary (``draft_vocab``) reads its rows of the unquantized
    ``lm_head.weight`` and applies the ``LogitsProcessor``'s soft cap and scale itself
    (``compute_logits`` always multiplies by the whole head).
Upstream: a "standalone model on caller-owned KV" API (vLLM's V2 speculators move
  towards one), or the ``custom_class`` hook handing proposers a KV-cache group.
Remove when: vLLM exposes such an API; then DraftKernels becomes a thin adapter. The
  reduced head goes when ``compute_logits`` takes a vocabulary subset (vLLM's EAGLE-3
  drafts map a smaller head to target ids, ``draft_id_to_target_id``, per model class).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import torch

logger = logging.getLogger("vllm.specdec_plugin")

MODEL_TAG = "specdec_draft"  # layer-name prefix and compile-cache tag of the draft


@dataclass
class DraftKernels:
    """The loaded draft: vLLM model, private config, attention group, bound KV."""

    model: torch.nn.Module
    vllm_config: Any           # the draft's private VllmConfig
    layer_names: list[str]
    builder: Any               # the backend's AttentionMetadataBuilder
    kv_bytes: int
    block_size: int
    num_blocks: int
    backend_name: str
    compiled: bool             # torch.compile is on for the draft forward
    vocab_size: int = 0        # V of the logits forward returns
    vocab_ids: torch.Tensor | None = None  # int64 [N]: a reduced draft vocabulary
    head: torch.Tensor | None = None       # [N, H]: the head's rows for vocab_ids

    # ---------------------------------------------------------------- per pass

    def metadata(self, query_start_loc: torch.Tensor, query_start_loc_cpu: torch.Tensor,
                 seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, num_tokens: int,
                 max_query_len: int, max_seq_len: int, block_table: torch.Tensor,
                 slot_mapping: torch.Tensor, positions: torch.Tensor) -> Any:
        """The backend's attention metadata for one pass: query_start_loc[_cpu] int32
        [B+1]; seq_lens[_cpu] int32 [B] (context with this pass's tokens); block_table
        int32 [B, NB]; slot_mapping, positions int64 [T] (on the draft's device)."""
        from vllm.v1.attention.backend import CommonAttentionMetadata

        common = CommonAttentionMetadata(
            query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc_cpu,
            seq_lens=seq_lens, num_reqs=int(seq_lens.shape[0]),
            num_actual_tokens=num_tokens, max_query_len=max_query_len,
            max_seq_len=max_seq_len, block_table_tensor=block_table,
            slot_mapping=slot_mapping, causal=True, positions=positions,
            seq_lens_cpu_upper_bound=seq_lens_cpu)
        return self.builder.build(0, common, fast_build=True)

    def forward(self, attn_metadata: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                slot_mapping: torch.Tensor, sample_index: torch.Tensor,
                reduced: bool = False) -> torch.Tensor:
        """Logits [len(sample_index), V] float32 (input_ids int32 [T]; positions int64 [T];
        sample_index int64: the tokens whose logits are needed). With a reduced vocabulary
        only its N logits are computed, the rest ``OUTSIDE``; with ``reduced`` the N
        alone, [len(sample_index), N] in ``vocab_ids`` order."""
        from vllm.forward_context import set_forward_context

        names = self.layer_names
        with set_forward_context({n: attn_metadata for n in names}, self.vllm_config,
                                 num_tokens=int(input_ids.shape[0]),
                                 slot_mapping={n: slot_mapping for n in names}):
            hidden = self.model(input_ids=input_ids, positions=positions)
        if self.head is None:
            return self.model.compute_logits(hidden[sample_index]).float()
        return self._reduced_logits(hidden[sample_index], reduced)

    def _reduced_logits(self, hidden: torch.Tensor, only_set: bool) -> torch.Tensor:
        """hidden [n, H] -> [n, V] float32: the head's N rows as vLLM's LogitsProcessor
        would apply them (soft cap, then scale), the rest ``OUTSIDE``; [n, N] alone
        with ``only_set``."""
        from vllm_specdec_plugin.draft_vocab import OUTSIDE

        sub = torch.nn.functional.linear(hidden, self.head).float()       # [n, N]
        lp = self.model.logits_processor
        if getattr(lp, "soft_cap", None):
            sub = torch.tanh(sub / lp.soft_cap) * lp.soft_cap
        if getattr(lp, "scale", 1.0) != 1.0:
            sub = sub * lp.scale
        if only_set:
            return sub
        out = torch.full((hidden.shape[0], self.vocab_size), OUTSIDE, dtype=torch.float32,
                         device=hidden.device)
        return out.index_copy_(1, self.vocab_ids, sub)


def reduced_head(model: Any, vocab_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The rows ``vocab_ids`` (int64 [N]) of the draft's output head, [N, H] contiguous,
    read as vLLM's Llama-family classes hold it (``lm_head``, tied or not, unquantized)."""
    from vllm_specdec_plugin.errors import SpecDecConfigError

    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    method = type(getattr(head, "quant_method", None)).__name__
    if not isinstance(weight, torch.Tensor) or method != "UnquantizedEmbeddingMethod":
        raise SpecDecConfigError(
            f"draft_vocab needs a draft whose output head is an unquantized lm_head; "
            f"{type(model).__name__} has {type(head).__name__} ({method}). Fix: remove "
            "draft_vocab, or use an unquantized draft.")
    if int(vocab_ids.max()) >= weight.shape[0]:
        raise SpecDecConfigError(
            f"draft_vocab has ids up to {int(vocab_ids.max())} but the draft's head has "
            f"{weight.shape[0]} rows. Fix: write the file with the draft's tokenizer.")
    return weight.detach().index_select(0, vocab_ids.to(weight.device)).contiguous().to(device)


def draft_vllm_config(target: Any, draft_path: str | Path, block_size: int,
                      dtype: torch.dtype) -> Any:
    """The draft's private VllmConfig, built like SpeculativeConfig builds the in-tree
    draft's ModelConfig (speculative.py), but never shared with the target."""
    from vllm.config import ModelConfig

    tmc = target.model_config
    draft_mc = ModelConfig(
        model=str(draft_path), runner="draft", tokenizer=tmc.tokenizer,
        tokenizer_mode=tmc.tokenizer_mode, trust_remote_code=tmc.trust_remote_code,
        dtype=dtype, seed=tmc.seed, max_model_len=tmc.max_model_len,
        enforce_eager=tmc.enforce_eager, max_logprobs=tmc.max_logprobs,
        config_format=tmc.config_format)
    return replace(
        target, model_config=draft_mc, quant_config=None, lora_config=None,
        compilation_config=replace(target.compilation_config),
        cache_config=replace(target.cache_config, block_size=block_size,
                             enable_prefix_caching=False))


@contextmanager
def _as_draft(cfg: Any) -> Iterator[None]:
    """The draft's config is vLLM's current one, under the draft's compile tag."""
    from vllm.compilation.backends import set_model_tag
    from vllm.config import set_current_vllm_config

    with set_model_tag(MODEL_TAG), set_current_vllm_config(cfg):
        yield


def load(target: Any, draft_path: str | Path, block_size: int, num_blocks: int,
         dtype: torch.dtype, device: torch.device, vocab_ids: torch.Tensor | None = None,
         vocab_size: int = 0) -> DraftKernels:
    """Load the draft with vLLM's loader and bind ``num_blocks`` blocks of its own KV;
    ``vocab_ids`` (int64 [N]) restricts its proposals to those tokens of the
    ``vocab_size`` its logits keep."""
    from vllm.config import CompilationMode, get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader import get_model
    from vllm.v1.attention.backends.utils import record_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
    from vllm.v1.worker.utils import AttentionGroup, allocate_kv_cache, customize_attention_spec

    cfg = draft_vllm_config(target, draft_path, block_size, dtype)
    with _as_draft(cfg):
        model = get_model(vllm_config=cfg, prefix=MODEL_TAG)
    layers = get_layers_from_vllm_config(cfg, AttentionLayerBase)
    names = list(layers)
    if not names:
        raise RuntimeError(f"draft {draft_path}: vLLM's model has no attention layers")
    backends = {layers[n].get_attn_backend() for n in names}
    if len(backends) != 1:
        raise RuntimeError(f"draft layers use several attention backends "
                           f"{sorted(b.get_name() for b in backends)}; the plugin's draft supports one")
    backend = backends.pop()
    # The engine resolves the target's layout only after load_model: pick the
    # draft's from its own backend (the first layout it supports).
    layout = backend.supported_kv_cache_layouts()[0]
    record_kv_cache_layout(cfg.cache_config, layout.name)
    specs = {n: customize_attention_spec(backend, layers[n].get_kv_cache_spec(cfg)) for n in names}
    groups = get_kv_cache_groups(cfg, specs)
    if len(groups) != 1:
        raise RuntimeError(
            f"draft {draft_path} needs {len(groups)} KV-cache groups (sliding-window or "
            "hybrid attention); the plugin's draft KV supports one. Fix: use a draft with "
            "uniform full attention.")
    per_block = groups[0].kv_cache_spec.page_size_bytes * len(names)
    kv_cfg = get_kv_cache_config_from_groups(cfg, groups, per_block * num_blocks)
    kv = allocate_kv_cache(kv_cfg, device, layout, [block_size])
    for n in names:
        layers[n].bind_kv_cache(kv[n])
    group = AttentionGroup(backend, names, groups[0].kv_cache_spec, 0)
    group.create_metadata_builders(cfg, device)
    compiled = cfg.compilation_config.mode != CompilationMode.NONE
    return DraftKernels(
        model=model, vllm_config=cfg, layer_names=names,
        builder=group.get_metadata_builder(), kv_bytes=per_block * kv_cfg.num_blocks,
        block_size=block_size, num_blocks=kv_cfg.num_blocks, backend_name=backend.get_name(),
        compiled=compiled, vocab_size=vocab_size,
        vocab_ids=None if vocab_ids is None else vocab_ids.to(device),
        head=None if vocab_ids is None else reduced_head(model, vocab_ids, device))
