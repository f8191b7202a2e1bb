"""Start-up checks that a draft model can serve a target. Each failure names the fix.

Reads config.json / generation_config.json / tokenizer files only (no weights), so a
bad pair fails before the target's weights are loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vllm_specdec_plugin.config import DTYPE_BYTES
from vllm_specdec_plugin.errors import DraftCompatibilityError, SpecDecConfigError


def _registered_architectures() -> set[str]:
    """Every model architecture vLLM registers (public ``vllm.ModelRegistry``)."""
    from vllm import ModelRegistry

    return set(ModelRegistry.get_supported_archs())


def resolve_draft_path(ref: str) -> Path:
    """A local folder for ``ref``: the path itself, or a cached Hugging Face snapshot."""
    p = Path(os.path.expanduser(ref))
    if p.is_dir():
        if not os.access(p, os.R_OK | os.X_OK):
            raise SpecDecConfigError(f"draft model folder {p} is not readable. Fix its permissions.")
        if not (p / "config.json").is_file():
            raise SpecDecConfigError(
                f"draft model folder {p} has no config.json. Fix: point draft_model at a "
                "Hugging Face model folder (config.json, *.safetensors, tokenizer files).")
        return p
    if p.exists():
        raise SpecDecConfigError(
            f"draft_model {p} is a file, not a model folder. Fix: pass the folder that holds "
            "config.json and the weights.")
    if ref.count("/") == 1 and not ref.startswith((".", "/", "~")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(ref, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
        except Exception as e:  # offline, gated, missing
            raise SpecDecConfigError(
                f"draft model {ref!r} is not a local folder and could not be fetched from "
                f"the Hugging Face hub ({type(e).__name__}: {e}). Fix: download it first "
                "(huggingface-cli download) and pass the local folder.") from None
    raise SpecDecConfigError(
        f"draft model folder {ref!r} does not exist. Fix: set draft_model to the local "
        "folder of the draft checkpoint.")


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecDecConfigError(f"cannot read {path}: {e}. Fix or replace the file.") from None


def _eos(eos: Any, folder: str | Path | None) -> set[int]:
    """EOS ids: a config's ``eos_token_id`` (int or list) and its folder's
    generation_config.json's."""
    ids: set[int] = set()
    gen = Path(folder, "generation_config.json") if folder else None
    for e in (eos, _json(gen).get("eos_token_id") if gen and gen.is_file() else None):
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
    return ids


def check_draft_compatible(draft: Path, target_hf_config: Any, target_tokenizer: str,
                           target_model_dir: str | None, max_model_len: int,
                           probe: str) -> dict[str, Any]:
    """The draft's config.json as a dict; DraftCompatibilityError unless ``draft`` can
    draft for the target (``target_hf_config``: its transformers config)."""
    cfg = _json(draft / "config.json")
    arch = (cfg.get("architectures") or ["?"])[0]
    if not arch.endswith("ForCausalLM") or arch not in _registered_architectures():
        raise DraftCompatibilityError(
            f"draft architecture {arch} (model_type={cfg.get('model_type')}) is not a causal "
            "LM that vLLM 0.32 registers; the draft runs on vLLM's own model classes. Fix: "
            "use a decoder-only draft of an architecture vLLM supports (e.g. Llama, Qwen2, "
            "Qwen3, Mistral) that shares the target's tokenizer.")
    t_vocab = getattr(target_hf_config, "vocab_size", None)
    if cfg.get("vocab_size") != t_vocab:
        raise DraftCompatibilityError(
            f"draft vocab_size {cfg.get('vocab_size')} != target vocab_size {t_vocab}. Fix: "
            "pick a draft trained with the target's tokenizer (same family, e.g. "
            "Llama-3.2-1B for Llama-3.2-3B).")
    t_eos = _eos(getattr(target_hf_config, "eos_token_id", None), target_model_dir)
    d_eos = _eos(cfg.get("eos_token_id"), draft)
    if t_eos and d_eos and not (t_eos & d_eos):
        raise DraftCompatibilityError(
            f"draft EOS token ids {sorted(d_eos)} share none with the target's {sorted(t_eos)}. "
            "Fix: use a draft from the same model family / tokenizer as the target.")
    d_max = int(cfg.get("max_position_embeddings", 0))
    if d_max < max_model_len:
        raise DraftCompatibilityError(
            f"draft max_position_embeddings {d_max} < served max_model_len {max_model_len}. "
            f"Fix: serve with --max-model-len {d_max} or lower, or use a draft with a "
            "longer context.")
    _check_tokenizers(draft, target_tokenizer, probe)
    return cfg


def _check_tokenizers(draft: Path, target_tokenizer: str, probe: str) -> None:
    d_ids, t_ids = _encode(draft, probe, "draft"), _encode(Path(target_tokenizer), probe, "target")
    if d_ids != t_ids:
        raise DraftCompatibilityError(
            f"draft and target tokenizers disagree on the probe string {probe!r}: draft "
            f"{d_ids[:12]}... vs target {t_ids[:12]}.... Fix: the draft must use the "
            "target's tokenizer (same vocabulary and merges).")


def _encode(folder: Path, probe: str, who: str) -> list[int]:
    """Token ids of ``probe`` (no special tokens): a tokenizer.json read as written by the
    ``tokenizers`` library (that file defines the ids; transformers may substitute a
    class by model_type, e.g. Qwen2Tokenizer, whose pre-tokenizer differs), else
    transformers' AutoTokenizer (hub ids, sentencepiece)."""
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
            probe, add_special_tokens=False).ids
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder)).encode(probe, add_special_tokens=False)
    except Exception as e:
        if who == "target":
            raise
        raise DraftCompatibilityError(
            f"cannot load the draft's tokenizer from {folder} ({type(e).__name__}: {e}). "
            "Fix: copy the target's tokenizer files into the draft folder.") from None


def check_draft_budget(draft_cfg: dict[str, Any], dtype: str, block_size: int,
                       budget_mib: float, max_model_len: int) -> int:
    """Blocks the draft KV budget holds (``draft_cfg``: its config.json); SpecDecConfigError
    if fewer than one request."""
    heads = int(draft_cfg["num_attention_heads"])
    kv_heads = int(draft_cfg.get("num_key_value_heads") or heads)
    head_dim = int(draft_cfg.get("head_dim") or int(draft_cfg["hidden_size"]) // heads)
    per_block = 2 * int(draft_cfg["num_hidden_layers"]) * block_size * kv_heads * head_dim \
        * DTYPE_BYTES[dtype]
    num_blocks = int(budget_mib * 2**20 // per_block)
    one_request = -(-max_model_len // block_size)
    if num_blocks < one_request:
        raise SpecDecConfigError(
            f"draft_kv_cache_mib={budget_mib} holds {num_blocks} blocks of {block_size} "
            f"tokens, less than one request of max_model_len={max_model_len}. Fix: set "
            f"draft_kv_cache_mib >= {one_request * per_block / 2**20:.1f}.")
    return num_blocks
