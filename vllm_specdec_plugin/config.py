"""The plugin's configuration: one validated dataclass, fed from three sources.

Precedence (later wins): a YAML preset (``preset: NAME``, shipped in ``configs/``, or a
path) < ``--additional-config '{"specdec": {...}}'`` < ``--speculative-config`` key
``draft_load_config.model_loader_extra_config.specdec``; k is vLLM's
``num_speculative_tokens``. Keys are the fields below. A preset holds option: value
pairs, at the top or under ``specdec:``; its ``draft_model`` and ``draft_vocab`` may use
``$VARS`` and be relative to it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from vllm_specdec_plugin.errors import SpecDecConfigError
from vllm_specdec_plugin.tuning import K_CEILING, MAX_K, TPOT_LIMIT, TTFT_LIMIT

# The draft dtypes the plugin takes, with their bytes per element: the one dtype map.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# ngram_corpus_scope values (what each shares: tenancy.py)
SCOPES = ("salt", "off", "global")
METHODS = ("draft", "ngram", "hybrid")
CONFIG_KEY = "specdec"
_CONSTANT = "it is a constant now (vllm_specdec_plugin/tuning.py, with the measurement that set it)"
# Options that existed once, with what replaced them (named in the start-up error).
REMOVED_OPTIONS = {
    "hybrid_min_ngram": "hybrid now picks n-gram or the draft model per request and round "
                        "by predicted speedup from measured acceptance and cost",
    "step_plan": "verification beside a prompt is always bounded; use ttft_limit (a large "
                 "value such as 100 verifies every draft)",
    "ttft_slack": "use ttft_limit, a ratio to the first token without speculation "
                  "(1.05 is the old 0.025: two steps of 2.5 %)",
    "arrival_cap": "the step a new request waits for is always bounded by ttft_limit",
    "prefill_split": "vLLM admits prompts as without speculation (splitting moved time "
                     "from first tokens into TPOT)",
    "row_slack": "use tpot_limit, a ratio to the time per token without speculation "
                 "(1.02 is the old 0.02)",
    "step_min_gain": _CONSTANT + " (MIN_GAIN 0.02; 0.10 only lost throughput)",
    "host_gate": "planning is always skipped where it costs more host time than it saves",
    "adaptive_prior_alpha": _CONSTANT + " (PRIOR_ALPHA); measured acceptance replaces it",
    "ngram_max_n": _CONSTANT, "ngram_min_n": _CONSTANT, "ngram_window": _CONSTANT,
    "ngram_min_prob": _CONSTANT, "ngram_corpus_min_n": _CONSTANT, "tokenizer_probe": _CONSTANT,
    "block_size": _CONSTANT + " (32 tokens, what vLLM's CPU attention takes)",
    "draft_prefill_budget": "a round feeds at most vLLM's --max-num-batched-tokens",
    "draft_dtype": "the draft runs in the target's dtype (vLLM's --dtype)",
    "draft_sampling": "sampled requests draft from the draft's distribution q (exact, "
                      "and accepted more often than point masses)",
}
PROPOSER_PREFIX = "vllm_specdec_plugin."  # custom_class names of this plugin's proposers


@dataclass(frozen=True, slots=True)
class SpecDecConfig:
    """Options of the plugin's proposer. Every field is a user option (README table)."""

    draft_model: str | None = None
    """Local folder (or cached hub id) of the draft model, Hugging Face layout. Must share
    the target's tokenizer. Without one the plugin drafts by n-gram lookup only."""

    method: str = "auto"
    """Where drafts come from: "hybrid" (per request and round, the draft model or
    n-gram lookup, whichever the policy prices higher), "draft" (the model only),
    "ngram" (lookup only, no model), or "auto": hybrid with a draft model, else ngram."""

    adaptive: bool = True
    """Choose k per request and round in [0, k] by the step policy (``control.policy``):
    measured acceptance and costs, within the latency limits. Off: always k."""

    num_speculative_tokens: int = K_CEILING
    """k: vLLM's own num_speculative_tokens, the ceiling with ``adaptive``."""

    draft_vocab: str | None = None
    """JSON file of target token ids the draft model may propose: its head computes only
    those logits (exact for any set). Write one with ``python -m
    vllm_specdec_plugin.draft_vocab``. None: the whole vocabulary."""

    draft_kv_cache_mib: float = 256.0
    """Memory of the draft's own paged KV cache, MiB. When it is full a request decodes
    without drafts for that round (counted as ``pool_full``)."""

    ngram_corpus_tokens: int = 65536
    """Tokens of finished requests (prompt + output, newest kept) that n-gram lookup also
    matches, so repeated traffic drafts its earlier continuation. 0: off."""

    ngram_corpus_scope: str = "salt"
    """Who drafts from whose finished requests and shares learned acceptance: "salt"
    (the same ``cache_salt``; unsalted with unsalted, as vLLM's prefix cache), "off"
    (no corpus), or "global" (everyone: a single-tenant server)."""

    tpot_limit: float = TPOT_LIMIT
    """Time per output token, as a ratio to without speculation, that speculation may
    cost a request that gains nothing from it (others' drafts slow its steps), over its
    life, as the cost model predicts it. 1.05: at most 5 % slower. Larger values let
    busy steps verify more."""

    ttft_limit: float = TTFT_LIMIT
    """First-token time, as a ratio to without speculation, that verification and draft
    rounds may cost a new request (the step it arrives in and its prefill step), as
    the cost model predicts it. 1.05: at most 5 % longer."""

    response_metrics: str = "summary"
    """Per-request acceptance in responses (vLLM's --per-request-spec-decode-metrics,
    which the plugin turns on when left at none): summary, detailed, or none."""

    preset: str | None = None
    """YAML preset the other options were layered on (a path, or a shipped preset's name)."""

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        if not isinstance(k, int) or k < 1:
            raise SpecDecConfigError(
                f"num_speculative_tokens must be >= 1, got {k!r}. Fix: set "
                '"num_speculative_tokens" in --speculative-config to 1..%d.' % MAX_K)
        if k > MAX_K:
            raise SpecDecConfigError(
                f"num_speculative_tokens={k} is above the supported maximum {MAX_K}. "
                f"Fix: use a smaller k; {K_CEILING} is the measured ceiling for adaptive "
                "modes (docs/serving-and-tuning.md).")
        if self.method == "auto":
            object.__setattr__(self, "method", "hybrid" if self.draft_model else "ngram")
        if self.method not in METHODS:
            raise SpecDecConfigError(
                f"method {self.method!r} is not one of auto, {', '.join(METHODS)}. "
                "Fix: use one of them.")
        if self.method != "ngram" and not self.draft_model:
            raise SpecDecConfigError(
                f"method {self.method!r} needs a draft model. Fix: add "
                '"draft_model": "/path/to/draft" to the specdec options, or use "method": '
                '"ngram" (no model).')
        if not isinstance(self.adaptive, bool):
            raise SpecDecConfigError(
                f"adaptive must be true or false, got {self.adaptive!r}. Fix: use a JSON boolean.")
        if not _number(self.draft_kv_cache_mib) or not self.draft_kv_cache_mib > 0:
            raise SpecDecConfigError(
                f"draft_kv_cache_mib must be > 0, got {self.draft_kv_cache_mib!r}. Fix: e.g. 256.")
        if not isinstance(self.ngram_corpus_tokens, int) or isinstance(
                self.ngram_corpus_tokens, bool) or not 0 <= self.ngram_corpus_tokens:
            raise SpecDecConfigError(
                f"ngram_corpus_tokens must be 0 (off) or a whole number of tokens, got "
                f"{self.ngram_corpus_tokens!r}. Fix: e.g. 65536.")
        if self.ngram_corpus_scope not in SCOPES:
            raise SpecDecConfigError(
                f"ngram_corpus_scope {self.ngram_corpus_scope!r} is not one of "
                f"{', '.join(SCOPES)}. Fix: use salt (tenants apart, the default), off, or "
                "global (one tenant only).")
        for name in ("tpot_limit", "ttft_limit"):
            value = getattr(self, name)
            if not _number(value) or not 1.0 <= value < float("inf"):
                raise SpecDecConfigError(
                    f"{name} must be a ratio >= 1, got {value!r}. Fix: e.g. 1.05 (at most "
                    "5 % slower than without speculation), or 1 for no slowdown at all.")
        if self.response_metrics not in ("summary", "detailed", "none"):
            raise SpecDecConfigError(
                f"response_metrics {self.response_metrics!r} is not one of summary, detailed, none. "
                "Fix: use one of them.")
        if self.draft_vocab is not None and not (isinstance(self.draft_vocab, str)
                                                 and self.draft_vocab):
            raise SpecDecConfigError(
                f"draft_vocab must be a file path, got {self.draft_vocab!r}. Fix: e.g. "
                '"draft_vocab": "/path/to/draft_vocab.json", or leave it out.')

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> "SpecDecConfig":
        """Validate keys and build; unknown keys get an error listing the valid ones."""
        known = set(cls.field_names())
        removed = sorted(set(options) & set(REMOVED_OPTIONS))
        if removed:
            raise SpecDecConfigError(
                f"plugin option(s) {removed} no longer exist: "
                + "; ".join(REMOVED_OPTIONS[k] for k in removed) + ". Fix: delete them.")
        unknown = sorted(set(options) - known)
        if unknown:
            raise SpecDecConfigError(
                f"unknown plugin option(s) {unknown}. Fix: use only the valid options "
                f"{sorted(known)}.")
        try:
            return cls(**options)
        except TypeError as e:  # wrong value types for dataclass fields
            raise SpecDecConfigError(
                f"invalid plugin option value: {e}. Fix: see the option table in the README.") from None


def _number(value: Any) -> bool:
    """A JSON number, not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def selects_plugin(method: Any, model: Any) -> bool:
    """True when a speculative config's ``method``/``model`` pick this plugin's proposer."""
    return method == "custom_class" and str(model or "").startswith(PROPOSER_PREFIX)


def resolve_dtype(target_dtype: Any) -> str:
    """The draft's dtype name: the target's (float32 for one the draft cannot take)."""
    name = str(target_dtype).removeprefix("torch.")
    return name if name in DTYPE_BYTES else "float32"


def merge_sources(num_speculative_tokens: int, *layers: Mapping[str, Any] | None) -> SpecDecConfig:
    """Merge option layers (later wins), expanding any ``preset`` first, and validate."""
    merged: dict[str, Any] = {}
    explicit: dict[str, Any] = {}
    for layer in layers:
        if layer:
            if not isinstance(layer, Mapping):
                raise SpecDecConfigError(
                    f"plugin options must be a JSON object under {CONFIG_KEY!r}, got {layer!r}. "
                    'Fix: e.g. {"draft_model": "/path/to/draft"}.')
            explicit.update(layer)
    preset = explicit.get("preset")
    if preset:
        merged.update(load_preset(str(preset)))
    merged.update(explicit)
    merged["num_speculative_tokens"] = num_speculative_tokens
    return SpecDecConfig.from_mapping(merged)


def from_vllm_config(vllm_config: Any) -> SpecDecConfig:
    """Collect the plugin options from a VllmConfig (duck-typed; no vLLM import)."""
    spec = vllm_config.speculative_config
    additional = (getattr(vllm_config, "additional_config", None) or {}).get(CONFIG_KEY)
    extra = None
    load_cfg = getattr(spec, "draft_load_config", None)
    if load_cfg is not None:
        extra = (getattr(load_cfg, "model_loader_extra_config", None) or {}).get(CONFIG_KEY)
    return merge_sources(spec.num_speculative_tokens, additional, extra)


SHIPPED = Path(__file__).resolve().parent / "configs"  # package data (pyproject.toml)


def load_preset(ref: str) -> dict[str, Any]:
    """Read a YAML preset given as a path or as the name of a shipped one."""
    import yaml

    candidates = [Path(ref), SHIPPED / ref, SHIPPED / f"{ref}.yaml"]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise SpecDecConfigError(
            f"preset {ref!r} not found (looked at {[str(c) for c in candidates]}). Fix: "
            f"pass an existing YAML path or one of {sorted(p.stem for p in SHIPPED.glob('*.yaml'))}.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecDecConfigError(
            f"preset {path} is not valid YAML{where}: {getattr(e, 'problem', None) or e}. "
            "Fix the file.") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecDecConfigError(
            f"preset {path} must be a YAML mapping of option: value. Fix the file.")
    data = dict(data.get(CONFIG_KEY, data))
    if "preset" in data:
        raise SpecDecConfigError(
            f"preset {path} may not name another preset. Fix: copy its options instead.")
    for key in ("draft_model", "draft_vocab"):
        ref = data.get(key)
        if isinstance(ref, str) and ref:
            ref = os.path.expandvars(ref)
            if not os.path.isabs(ref) and (path.parent / ref).exists():
                ref = str(path.parent / ref)
            data[key] = ref
    return data
