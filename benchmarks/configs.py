"""What is benchmarked: the configuration table and the workload table.

A configuration is one engine: a speculative method, k, and extra options. The
table below is the only place to edit when a method or plugin mode is added; a
new plugin mode is one ``Entry`` line (its options go to the plugin's ``specdec``
section, the same keys as ``SpecDecConfig``)::

    Entry("plugin-adaptive", "plugin", K_SWEEP, specdec={"adaptive_k": True}),
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

K_SWEEP = (2, 4, 6)

# VLLM_PLUGINS per method. vLLM reads it as os.environ["VLLM_PLUGINS"].split(","),
# or None (= load every general plugin) when unset. "" therefore becomes [""], an
# allow-list that matches no entry point: nothing is loaded, not even vLLM's own
# LoRA resolvers. "specdec" loads this plugin only. So the two sets differ by
# exactly our plugin; run.py verifies it per engine via SPECDEC_REGISTER_TRACE.
PLUGINS_NONE = ""
PLUGINS_SPECDEC = "specdec"
# The configuration every speedup is paired against.
BASELINE = "nospec"
# The A/A control: a second engine without speculation, its ratios the run's noise floor.
A_A = "nospec-again"


@dataclass(frozen=True)
class Method:
    """How to build one speculative method's vLLM ``speculative_config``."""

    kind: str                   # none | draft_model | ngram | suffix | plugin
    vllm_plugins: str           # the VLLM_PLUGINS value its engine runs with
    needs_draft: bool = False
    # Packages outside the project venv its engine needs (serving: on PYTHONPATH).
    # suffix: arctic-inference, built by scripts/install_suffix.sh.
    extra_site: str | None = None


METHODS: dict[str, Method] = {
    "none": Method("none", PLUGINS_NONE),
    "draft_model": Method("draft_model", PLUGINS_NONE, needs_draft=True),
    "ngram": Method("ngram", PLUGINS_NONE),
    "suffix": Method("suffix", PLUGINS_NONE, extra_site=".cache/suffix/site"),
    "plugin": Method("plugin", PLUGINS_SPECDEC, needs_draft=True),
    "plugin-nodraft": Method("plugin", PLUGINS_SPECDEC),   # n-gram mode: no draft model
}


@dataclass(frozen=True)
class Entry:
    """One row of the table: a name prefix, a method, the k values, extra options.

    spec: extra keys for vLLM's SpeculativeConfig (merged last).
    specdec: extra plugin options (the ``specdec`` section; plugin methods only).
    """

    name: str
    method: str
    ks: tuple[int, ...] = ()
    spec: dict[str, Any] = field(default_factory=dict)
    specdec: dict[str, Any] = field(default_factory=dict)


SUFFIX_TREE_DEPTH = 24  # vLLM's default suffix_decoding_max_tree_depth (and suffix k)

TABLE: list[Entry] = [
    Entry(BASELINE, "none"),
    # The A/A control: a second engine without speculation, measured like any method.
    # Its paired ratios to nospec are the run's noise floor (machine drift, batch
    # timing); a method whose ratios stay inside that spread differs by no measured amount.
    Entry(A_A, "none"),
    # More servers without speculation, for checking how much one server process's
    # speed varies with its start order or by process (the A/A control's spread).
    Entry("nospec-a3", "none"),
    Entry("nospec-a4", "none"),
    Entry("draft_model", "draft_model", K_SWEEP),
    Entry("ngram", "ngram", (4,), spec={"prompt_lookup_max": 4, "prompt_lookup_min": 1}),
    # vLLM's suffix decoding (arctic-inference); k is its ceiling per step. Above
    # SUFFIX_TREE_DEPTH the tree depth is raised to k (a deeper tree is the only way
    # suffix drafts more).
    Entry("suffix", "suffix", (8, SUFFIX_TREE_DEPTH, 32)),
    Entry("plugin", "plugin", K_SWEEP),
    # Issue 7 modes. Adaptive modes get a larger k: it is the ceiling they choose under.
    Entry("plugin-ngram", "plugin-nodraft", (4,), specdec={"method": "ngram"}),
    Entry("plugin-hybrid", "plugin", (4,), specdec={"method": "hybrid"}),
    Entry("plugin-adaptive", "plugin", (8,), specdec={"adaptive": True}),
    # Ceilings 4-32: the k ceiling sweep that set tuning.K_CEILING (8) and MAX_K (32).
    Entry("plugin-hybrid-adaptive", "plugin", (4, 8, 16, 32),
          specdec={"method": "hybrid", "adaptive": True}),
    # The same without the step plan (drafts verified as proposed beside prefills,
    # first tokens after the draft round): the step plan's before/after in one run.
    Entry("plugin-hybrid-adaptive-noplan", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "step_plan": False}),
    # The step plan with no verify tokens beside a prefill (ttft_slack 0) against the
    # default: what the allowance costs the first token and buys in throughput.
    Entry("plugin-hybrid-adaptive-ttft0", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "ttft_slack": 0.0}),
    # ttft_slack 0.025 explicitly (the default since 2026-11-30; it was 0.05), for sweeps
    # that run it beside other values: the arrival step and the prefill step then add at
    # most 5 % of a prefill step to a first token.
    Entry("plugin-hybrid-adaptive-ttft025", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "ttft_slack": 0.025}),
    # Without arrival_cap (the step after a request finished verifies every draft)
    # against the default: what capping the step a closed loop's next request waits
    # for buys in first token and costs in throughput.
    Entry("plugin-hybrid-adaptive-noarrival", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "arrival_cap": False}),
    # With prefill_split (bunched arrivals admitted one step at a time; the default
    # admits every waiting prompt vLLM's budget holds): what it moves from the first
    # token to the decode of the prompt admitted first.
    Entry("plugin-hybrid-adaptive-split", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "prefill_split": True}),
    # The same without the per-request bound (row_slack 1000: the batch's mean alone
    # decides): what protecting every request's TPOT costs, in one run.
    Entry("plugin-hybrid-adaptive-meanonly", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "row_slack": 1000.0}),
    # row_slack 0.2 (the default until 2026-11-29), 0.05 (until 2026-11-30) and 0.1,
    # explicitly, for sweeps that run them beside each other.
    Entry("plugin-hybrid-adaptive-slack20", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "row_slack": 0.2}),
    Entry("plugin-hybrid-adaptive-slack05", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "row_slack": 0.05}),
    Entry("plugin-hybrid-adaptive-slack10", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "row_slack": 0.1}),
    # row_slack 0.02 (today's default, explicitly): the per-request bound at the TPOT p50
    # target (1.02x) itself.
    Entry("plugin-hybrid-adaptive-slack02", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "row_slack": 0.02}),
    # step_min_gain 0.1 against the default: a verifying step must be predicted 10 %
    # faster per token over all its rows, not 2 % (what the marginal steps cost the
    # rows that draft nothing, in TPOT p50, against what they add to throughput).
    Entry("plugin-hybrid-adaptive-gain10", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "step_min_gain": 0.1}),
    # The draft proposes only from the pair's draft_vocab.json (the real pair ships one:
    # 16,384 of 49,152 ids), so its head computes a third of the logits.
    Entry("plugin-hybrid-adaptive-vocab", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "draft_vocab": "{draft}/draft_vocab.json"}),
    Entry("plugin-vocab", "plugin", (4,), specdec={"draft_vocab": "{draft}/draft_vocab.json"}),
    # The n-gram stage without its confidence threshold (ngram_min_prob 0: drafts up
    # to k whatever the followers' frequencies): what the threshold does, in one run.
    Entry("plugin-hybrid-adaptive-p0", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "ngram_min_prob": 0.0}),
    # The n-gram stage keyed on up to 8 tokens of context (default 4): the replay on
    # the bench pair's unique code accepted 4 % more a round (2026-11-30), served here.
    Entry("plugin-hybrid-adaptive-n8", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "ngram_max_n": 8}),
    # Without the host gate (every step planned, as before 2026-11-30): against the
    # default, what skipping planning where it does not pay its host time buys under load.
    Entry("plugin-hybrid-adaptive-nogate", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "host_gate": False}),
    # Adaptive n-gram drafting alone (no draft model, so no draft prefill or draft
    # rounds): against hybrid, what the draft model costs and buys under load.
    Entry("plugin-ngram-adaptive", "plugin-nodraft", (8,),
          specdec={"method": "ngram", "adaptive": True}),
    # The plugin's floor: n-gram drafting that never drafts (no follower reaches a
    # confidence of 1), adaptive, no draft model. Every step runs the proposer's
    # planning and verifies nothing: what the machinery costs where speculation can't pay.
    Entry("plugin-floor", "plugin-nodraft", (8,),
          specdec={"method": "ngram", "adaptive": True, "ngram_min_prob": 1.0}),
    # The floor with prefill_split on: against the floor, what admitting prompts one
    # step at a time costs when nothing is drafted.
    Entry("plugin-floor-split", "plugin-nodraft", (8,),
          specdec={"method": "ngram", "adaptive": True, "ngram_min_prob": 1.0,
                   "prefill_split": True}),
    # One corpus and one set of acceptance statistics for every request (single
    # tenant): against the default per-salt scope it prices tenant isolation.
    Entry("plugin-hybrid-adaptive-global", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "ngram_corpus_scope": "global"}),
]

QUICK_CONFIGS = ("nospec", "draft_model-k4", "ngram-k4", "plugin-k2", "plugin-k4")


@dataclass(frozen=True)
class BenchConfig:
    """One engine configuration (a row of the table at one k)."""

    name: str                   # e.g. "plugin-k4"; BASELINE ("nospec") is the baseline
    method: str
    k: int                      # 0 without speculation
    spec_extra: tuple = ()
    specdec_extra: tuple = ()

    @property
    def is_baseline(self) -> bool:
        return self.name == BASELINE

    @property
    def family(self) -> str:
        """The table row it came from (configs of one family differ only in k)."""
        return self.name.rsplit("-k", 1)[0] if self.k else self.name

    @property
    def vllm_plugins(self) -> str:
        return METHODS[self.method].vllm_plugins

    def engine_env(self, repo: Path) -> dict[str, str]:
        """Environment its engine process needs on top of the harness's own:
        VLLM_PLUGINS, and PYTHONPATH for packages kept outside the project venv."""
        env = {"VLLM_PLUGINS": self.vllm_plugins}
        site = METHODS[self.method].extra_site
        if site:
            path = repo / site
            if not path.is_dir():
                raise FileNotFoundError(f"{self.name} needs {path}, which is missing. "
                                        f"Fix: run `bash scripts/install_suffix.sh` first.")
            env["PYTHONPATH"] = os.pathsep.join(
                [str(path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        return env

    def speculative_config(self, draft: str | None) -> dict | None:
        """The ``speculative_config`` for ``vllm.LLM`` (None without speculation)."""
        kind = METHODS[self.method].kind
        if kind == "none":
            return None
        if METHODS[self.method].needs_draft and not draft:
            raise ValueError(f"{self.name} needs a draft model (--draft)")
        if kind == "draft_model":
            spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": self.k}
        elif kind == "ngram":
            spec = {"method": "ngram", "num_speculative_tokens": self.k}
        elif kind == "suffix":
            spec = {"method": "suffix", "num_speculative_tokens": self.k,
                    **({"suffix_decoding_max_tree_depth": self.k}
                       if self.k > SUFFIX_TREE_DEPTH else {})}
        elif kind == "plugin":
            # "{draft}" in an option's value is the pair's draft folder
            specdec = {**({"draft_model": draft} if draft else {}),
                       **{k: v.replace("{draft}", draft or "") if isinstance(v, str) else v
                          for k, v in self.specdec_extra}}
            spec = {"method": "custom_class", "model": "vllm_specdec_plugin.DraftModelProposer",
                    "num_speculative_tokens": self.k,
                    "draft_load_config": {"model_loader_extra_config": {"specdec": specdec}}}
        else:  # pragma: no cover - METHODS and this switch are edited together
            raise ValueError(kind)
        spec.update(dict(self.spec_extra))
        return spec


def expand(table: list[Entry] | None = None) -> list[BenchConfig]:
    """All configurations of the table, baseline first."""
    out = []
    for e in table or TABLE:
        if e.method not in METHODS:
            raise ValueError(f"unknown method {e.method!r} in entry {e.name!r}")
        for k in e.ks or (0,):
            out.append(BenchConfig(
                name=f"{e.name}-k{k}" if k else e.name, method=e.method, k=k,
                spec_extra=tuple(sorted(e.spec.items())),
                specdec_extra=tuple(sorted(e.specdec.items()))))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate configuration names: {names}")
    return out


def select(configs: list[BenchConfig], patterns: list[str] | None) -> list[BenchConfig]:
    """Configurations whose name matches any glob in ``patterns`` (all if None).

    The baseline ``nospec`` is always kept: every speedup is paired against it.
    """
    if not patterns:
        return list(configs)
    chosen = [c for c in configs if c.is_baseline or any(fnmatch.fnmatchcase(c.name, p)
                                                           for p in patterns)]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(c.name, p) for c in configs)]
    if unknown:
        raise ValueError(f"no configuration matches {unknown}; have {[c.name for c in configs]}")
    return chosen


# ------------------------------------------------------------------- workloads

@dataclass(frozen=True)
class Workload:
    """A prompt set, how many of its prompts, and how many run at once.

    batch_size < num_prompts means the prompts run in consecutive batches (the
    engine sees ``batch_size`` requests at a time).
    """

    name: str
    prompt_set: str             # a file benchmarks/prompts/<prompt_set>.txt
    num_prompts: int
    batch_size: int
    note: str = ""


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("single", "general", 1, 1, "one request alone (latency-bound)"),
    Workload("batch8", "general", 8, 8, "8 concurrent requests"),
    Workload("batch32", "general", 32, 32, "32 concurrent requests"),
    Workload("repetitive", "repetitive", 4, 1,
             "code continuation of a repeated pattern, one request at a time (n-gram territory)"),
    Workload("novel", "novel", 4, 1, "English prose outside the training corpus, one at a time"),
    Workload("mixed1", "mixed", 8, 1, "half repetitive code, half novel prose, one at a time"),
    Workload("mixed8", "mixed", 8, 8, "half repetitive code, half novel prose, 8 at once"),
]}
QUICK_WORKLOADS = ("single", "batch8", "repetitive")
TEMPERATURES = (0.0, 0.8)
