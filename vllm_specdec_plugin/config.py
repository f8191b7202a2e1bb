"""The plugin's configuration: one validated dataclass, fed from three sources.

Precedence (later wins): a YAML preset (``preset: configs/NAME.yaml``) <
``--additional-config '{"specdec": {...}}'`` < ``--speculative-config`` key
``draft_load_config.model_loader_extra_config.specdec``. ``k`` itself is vLLM's
``num_speculative_tokens``. Keys map one to one onto the fields below.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from vllm_specdec_plugin.errors import SpecDecConfigError
from vllm_specdec_plugin.tuning import (K_CEILING, MAX_K, NGRAM_MAX_N, NGRAM_MIN_PROB, PRIOR_ALPHA,
                                        ROW_SLACK, STEP_MIN_GAIN, TTFT_SLACK)

# The draft dtypes the plugin takes, with their bytes per element: the one dtype map.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# ngram_corpus_scope values (what each shares: tenancy.py)
SCOPES = ("salt", "off", "global")
CONFIG_KEY = "specdec"
# Options that existed once, with what replaced them (named in the start-up error).
REMOVED_OPTIONS = {
    "hybrid_min_ngram": "hybrid now picks n-gram or the draft model per request and round "
                        "by predicted speedup from measured acceptance and cost",
}
PROPOSER_PREFIX = "vllm_specdec_plugin."  # custom_class names of this plugin's proposers


@dataclass(frozen=True, slots=True)
class SpecDecConfig:
    """Options of the draft-model proposer."""

    draft_model: str | None = None
    """Local folder of the draft model (Hugging Face layout: config.json, *.safetensors,
    tokenizer). Must share the target's tokenizer and vocabulary. Not used by
    method "ngram"."""

    draft_vocab: str | None = None
    """JSON file of target token ids the draft model may propose (``draft_vocab``):
    its head then computes only those logits, which at a large vocabulary is most of
    a draft token's time. Exact for any set; a set of the most frequent tokens in
    traffic like yours keeps nearly all acceptance. Write one with ``python -m
    vllm_specdec_plugin.draft_vocab``. None: the whole vocabulary."""

    method: str = "draft"
    """Where drafts come from: "draft" (the draft model), "ngram" (prompt lookup over
    the request's own tokens, no model), or "hybrid" (per request and round, whichever
    of the two predicts the larger speedup from its measured acceptance for that
    request and its measured cost; with ``adaptive`` also neither)."""

    adaptive: bool = False
    """Choose k per request and round in [0, k] from measured acceptance and costs
    (``adaptive.py``); k = 0 decodes that request plainly. Off: always k."""

    step_plan: bool = True
    """In a step that carries a prefill (a new or chunked prompt), keep only the drafts
    that fit beside it in vLLM's token budget and lengthen the step by little, most
    likely accepted first (``step_plan``); a step that completes a prompt returns its
    first token before drafting. Off: every draft is verified as proposed."""

    ttft_slack: float = TTFT_SLACK
    """Step plan: how much verification (verify tokens and the exact sampler's σ) may
    lengthen a step that carries a prefill, as a share of its predicted time without
    them (0.025: 2.5 %). 0 verifies no drafts beside a prefill; larger values trade
    first-token latency for throughput."""

    arrival_cap: bool = True
    """Step plan: a step scheduled after a request finished, and carrying no prefill,
    keeps only the verify tokens that (with σ) lengthen it by ``ttft_slack`` of a step
    that carries the finished request's prompt again. A client that sends its next
    request when an answer ends (a chat user, a closed-loop benchmark) finds that step
    running and waits for it before its own prefill. Off: such a step verifies every
    draft."""

    prefill_split: bool = False
    """Step plan: when several waiting prompts could share one step, admit them one step
    at a time where the fitted step cost says the prompts already in the step would
    lose more than the deferred one waits (on a CPU, where a step's time grows with its
    prompt tokens). This moves time, it does not save it: the deferred prompt's prefill
    lands in the decode of the one admitted first (its TTFT falls, its TPOT rises by as
    much) and the deferred one waits a step longer. Off (default): vLLM admits as many
    as its token budget holds, as without speculation."""

    ngram_max_n: int = NGRAM_MAX_N
    """Longest context (tokens) the n-gram stage matches; longer matches win."""

    ngram_min_n: int = 1
    """Shortest context (tokens) the n-gram stage accepts as a match."""

    ngram_window: int = 1024
    """The n-gram stage searches only the last this many tokens of the request."""

    ngram_min_prob: float = NGRAM_MIN_PROB
    """The n-gram stage drafts each context's most frequent follower, with that
    frequency as its confidence, and stops a draft before the product of its tokens'
    confidences would fall below this (as suffix decoding's ``min_token_prob``). 0:
    draft up to k whatever the confidence."""

    ngram_corpus_tokens: int = 65536
    """Methods ngram and hybrid: tokens of finished requests (prompt + output, newest
    kept) the n-gram stage also matches against, so traffic that repeats earlier
    prompts or outputs drafts their continuation (as suffix decoding does). 0: off."""

    ngram_corpus_min_n: int = 1
    """Shortest context (tokens) matched against finished requests (capped at
    ngram_max_n); a match in the request's own history of the same length or longer
    is preferred."""

    ngram_corpus_scope: str = "salt"
    """Who drafts from whose finished requests, and shares learned acceptance:
    "salt" (requests with the same ``cache_salt``; unsalted ones with each other, as
    vLLM's prefix cache), "off" (no corpus), or "global" (every request: a
    single-tenant deployment that wants the most replays). See ``tenancy``."""

    adaptive_prior_alpha: float = PRIOR_ALPHA
    """Adaptive: acceptance rate assumed for a request before it has been measured
    (replaced by the running average over all requests once there is one)."""

    row_slack: float = ROW_SLACK
    """Adaptive: how much a verifying step may slow any one request, per token (0.02:
    2 %, the TPOT p50 target). A request that drafts nothing, or whose drafts are
    seldom accepted, pays for the others' verification; drafts are cut (exactly: a
    prefix) until no request's expected time per token grows by more than this.
    Larger values trade tail latency (TPOT p99) for throughput; 1000 leaves the
    decision to the batch's mean alone."""

    step_min_gain: float = STEP_MIN_GAIN
    """Adaptive: a step verifies drafts only if it is predicted to emit this share more
    tokens per second than a plain step, over all its rows (0.02: 2 %), after the drafts
    were cut for ``row_slack``. Larger values verify fewer steps that each gain more;
    they do not spare the rows that draft nothing (``row_slack`` bounds what those pay,
    and they spend it in the fewer steps), so they give up throughput: 0.10 measured
    2-4 % below 0.02 on chat at c = 8 and 16 (``tuning.STEP_MIN_GAIN``)."""

    host_gate: bool = True
    """Adaptive, methods "ngram" and "hybrid": skip planning (every row's lookup and
    pricing, the draft round) at a batch size where the target time its verifications
    saved has fallen short of the host time planning took, probing with n-gram drafts
    now and then (``host_gate``). Rows then decode plainly. Off: every step is planned."""

    num_speculative_tokens: int = 4
    """k: draft tokens proposed per request and round (vLLM's num_speculative_tokens)."""

    block_size: int = 32
    """Tokens per block of the draft's own paged KV cache. vLLM's CPU attention
    backend takes multiples of 32 (its fast paths need them); GPU backends take 16
    and up."""

    draft_prefill_budget: int = 2048
    """Lazy draft prefill: at most this many committed tokens are fed to the draft per
    engine step, over all requests. A longer catch-up (a long prompt's first round)
    is fed in chunks over several steps, drafting nothing until it is caught up, so
    one long prompt in a full batch never costs more than this per step. In a step of
    several rows the feed is also bounded in time (``tuning.CATCH_UP_STEP_MAX``)."""

    draft_kv_cache_mib: float = 256.0
    """Memory budget of the draft KV cache in MiB; sets the number of blocks. When the
    pool is full, a request is decoded without drafts for that round (and counted)."""

    draft_dtype: str = "auto"
    """Draft weights/KV dtype: auto (the target's dtype), float32, bfloat16, float16."""

    draft_sampling: str = "sample"
    """How sampled (temperature > 0) requests draft: "sample" draws each draft from the
    draft's distribution q after the request's sampling pipeline and hands q to the
    rejection sampler; "greedy" drafts argmax tokens as point masses (q one-hot).
    Both are lossless; "sample" usually accepts more at high temperature."""

    tokenizer_probe: str = "def speculate(x):\n    return x ** 2  # naïve café €5 日本"
    """Text both tokenizers must encode identically (checked at start-up)."""

    response_metrics: str = "summary"
    """Per-request acceptance in responses (vLLM's --per-request-spec-decode-metrics,
    which the plugin turns on when left at none): summary, detailed, or none."""

    preset: str | None = None
    """YAML preset the other options were layered on (path, or a name in configs/)."""

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
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise SpecDecConfigError(
                f"block_size must be a power of two >= 1, got {self.block_size}. Fix: use 32.")
        if not isinstance(self.draft_prefill_budget, int) or self.draft_prefill_budget < 1:
            raise SpecDecConfigError(
                f"draft_prefill_budget must be a whole number of tokens >= 1, got "
                f"{self.draft_prefill_budget!r}. Fix: e.g. 2048.")
        if not self.draft_kv_cache_mib > 0:
            raise SpecDecConfigError(
                f"draft_kv_cache_mib must be > 0, got {self.draft_kv_cache_mib}. Fix: e.g. 256.")
        if self.draft_sampling not in ("sample", "greedy"):
            raise SpecDecConfigError(
                f"draft_sampling {self.draft_sampling!r} is not one of sample, greedy. Fix: use one of them.")
        if self.response_metrics not in ("summary", "detailed", "none"):
            raise SpecDecConfigError(
                f"response_metrics {self.response_metrics!r} is not one of summary, detailed, none. "
                "Fix: use one of them.")
        if self.method not in ("draft", "ngram", "hybrid"):
            raise SpecDecConfigError(
                f"method {self.method!r} is not one of draft, ngram, hybrid. Fix: use one of them.")
        if not isinstance(self.step_plan, bool):
            raise SpecDecConfigError(
                f"step_plan must be true or false, got {self.step_plan!r}. Fix: use a JSON boolean.")
        if not isinstance(self.arrival_cap, bool):
            raise SpecDecConfigError(
                f"arrival_cap must be true or false, got {self.arrival_cap!r}. Fix: use a JSON boolean.")
        if not isinstance(self.host_gate, bool):
            raise SpecDecConfigError(
                f"host_gate must be true or false, got {self.host_gate!r}. Fix: use a JSON boolean.")
        if not isinstance(self.prefill_split, bool):
            raise SpecDecConfigError(
                f"prefill_split must be true or false, got {self.prefill_split!r}. "
                "Fix: use a JSON boolean.")
        if not isinstance(self.adaptive, bool):
            raise SpecDecConfigError(
                f"adaptive must be true or false, got {self.adaptive!r}. Fix: use a JSON boolean.")
        if not (isinstance(self.ngram_min_n, int) and isinstance(self.ngram_max_n, int)
                and 1 <= self.ngram_min_n <= self.ngram_max_n):
            raise SpecDecConfigError(
                f"need 1 <= ngram_min_n <= ngram_max_n, got {self.ngram_min_n}, "
                f"{self.ngram_max_n}. Fix: e.g. ngram_min_n 1, ngram_max_n 4.")
        if not isinstance(self.ngram_window, int) or self.ngram_window <= self.ngram_max_n:
            raise SpecDecConfigError(
                f"ngram_window must be an integer > ngram_max_n, got {self.ngram_window!r}. "
                "Fix: e.g. 1024.")
        if isinstance(self.ngram_min_prob, bool) or not (
                isinstance(self.ngram_min_prob, (int, float)) and 0 <= self.ngram_min_prob <= 1):
            raise SpecDecConfigError(
                f"ngram_min_prob must be a number in [0, 1], got {self.ngram_min_prob!r}. "
                f"Fix: e.g. {NGRAM_MIN_PROB} (0 drafts whatever the confidence).")
        if not isinstance(self.ngram_corpus_tokens, int) or not (
                self.ngram_corpus_tokens == 0 or self.ngram_corpus_tokens > self.ngram_max_n):
            raise SpecDecConfigError(
                f"ngram_corpus_tokens must be 0 (off) or an integer > ngram_max_n, got "
                f"{self.ngram_corpus_tokens!r}. Fix: e.g. 65536.")
        if not (isinstance(self.ngram_corpus_min_n, int) and self.ngram_corpus_min_n >= 1):
            raise SpecDecConfigError(
                f"ngram_corpus_min_n must be an integer >= 1, got {self.ngram_corpus_min_n!r}. "
                "Fix: e.g. 3.")
        if self.ngram_corpus_scope not in SCOPES:
            raise SpecDecConfigError(
                f"ngram_corpus_scope {self.ngram_corpus_scope!r} is not one of "
                f"{', '.join(SCOPES)}. Fix: use salt (tenants apart, the default), off, or "
                "global (one tenant only).")
        if not 0.0 <= self.adaptive_prior_alpha < 1.0:
            raise SpecDecConfigError(
                f"adaptive_prior_alpha must be in [0, 1), got {self.adaptive_prior_alpha}. Fix: e.g. 0.6.")
        if not _finite_nonneg(self.row_slack):
            raise SpecDecConfigError(
                f"row_slack must be a number >= 0, got {self.row_slack!r}. Fix: e.g. {ROW_SLACK} "
                f"(the default: no request more than {ROW_SLACK * 100:g} % slower per token), "
                "or 1000 to rely on the batch's mean.")
        if not _finite_nonneg(self.step_min_gain):
            raise SpecDecConfigError(
                f"step_min_gain must be a number >= 0, got {self.step_min_gain!r}. Fix: e.g. "
                "0.1 (verify only steps predicted 10 % faster per token than a plain step).")
        if not _finite_nonneg(self.ttft_slack):
            raise SpecDecConfigError(
                f"ttft_slack must be a number >= 0, got {self.ttft_slack!r}. Fix: e.g. 0.025 "
                "(a step carrying a prefill at most 2.5 % longer), or 0 for no drafts beside prefills.")
        if self.draft_vocab is not None and not (isinstance(self.draft_vocab, str)
                                                 and self.draft_vocab):
            raise SpecDecConfigError(
                f"draft_vocab must be a file path, got {self.draft_vocab!r}. Fix: e.g. "
                '"draft_vocab": "/path/to/draft_vocab.json", or leave it out.')
        if self.draft_dtype not in ("auto", *DTYPE_BYTES):
            raise SpecDecConfigError(
                f"draft_dtype {self.draft_dtype!r} is not one of auto, float32, bfloat16, "
                "float16. Fix: use one of them.")

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
        if not options.get("draft_model") and options.get("method", "draft") != "ngram":
            raise SpecDecConfigError(
                "no draft model configured. Fix: add "
                '"draft_load_config": {"model_loader_extra_config": {"specdec": '
                '{"draft_model": "/path/to/draft"}}} to --speculative-config, or a '
                'preset with draft_model (or use "method": "ngram", which needs no draft model).')
        try:
            return cls(**options)
        except TypeError as e:  # wrong value types for dataclass fields
            raise SpecDecConfigError(
                f"invalid plugin option value: {e}. Fix: see the option table in the README.") from None


def _finite_nonneg(value: Any) -> bool:
    """A JSON number (not a boolean) in [0, inf)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and 0.0 <= value < float("inf")


def selects_plugin(method: Any, model: Any) -> bool:
    """True when a speculative config's ``method``/``model`` pick this plugin's proposer."""
    return method == "custom_class" and str(model or "").startswith(PROPOSER_PREFIX)


def resolve_dtype(draft_dtype: str, target_dtype: Any) -> str:
    """The draft's dtype name: ``draft_dtype``, or the target's for "auto"."""
    if draft_dtype != "auto":
        return draft_dtype
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
        from vllm_specdec_plugin.presets import load_preset  # it reads CONFIG_KEY from here

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

