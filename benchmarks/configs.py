"""What the serving benchmark serves: the configuration table.

A configuration is one ``vllm serve``: a speculative method, k, and extra options. The
table below is the only place to edit when a method or plugin mode is added; a
new plugin mode is one ``Entry`` line (its options go to the plugin's ``specdec``
section, the same keys as ``SpecDecConfig``)::

    Entry("plugin-fixed", "plugin", K_SWEEP, specdec={"adaptive": False}),
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

K_SWEEP = (2, 4, 6)

# VLLM_PLUGINS per method. vLLM reads it as os.environ["VLLM_PLUGINS"].split(","),
# or None (= load every general plugin) when unset. "" therefore becomes [""], an
# allow-list that matches no entry point: nothing is loaded, not even vLLM's own
# LoRA resolvers. "specdec" loads this plugin only. So the two sets differ by
# exactly our plugin.
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
    # The plugin package as of this git commit, exported (git archive) into extra_site
    # on first use: it comes before the editable install on PYTHONPATH.
    commit: str | None = None
    # The environment variable naming its commit instead (plugin kinds; default: the
    # --plugin-commit one, optional; any other: required).
    commit_env: str | None = None


# The plugin before the controller's rewrite (aa07521, 2026-12-02), served beside the
# working tree's as "plugin-before-*" configurations.
PLUGIN_BEFORE = "aa075210d7cd2d469497378ca4ea56dbf3fe5206"
# Set (a full commit id) by ``benchmarks.serving --plugin-commit``: every other plugin
# configuration serves the package as of that commit, exported like PLUGIN_BEFORE.
PLUGIN_COMMIT_ENV = "SPECDEC_PLUGIN_COMMIT"
# Set by ``--compare-commit``: the "plugin-compare-*" configurations serve that commit.
COMPARE_COMMIT_ENV = "SPECDEC_COMPARE_COMMIT"

METHODS: dict[str, Method] = {
    "none": Method("none", PLUGINS_NONE),
    "draft_model": Method("draft_model", PLUGINS_NONE, needs_draft=True),
    "ngram": Method("ngram", PLUGINS_NONE),
    "suffix": Method("suffix", PLUGINS_NONE, extra_site=".cache/suffix/site"),
    "plugin": Method("plugin", PLUGINS_SPECDEC, needs_draft=True),
    "plugin-nodraft": Method("plugin", PLUGINS_SPECDEC),   # n-gram mode: no draft model
    "plugin-before": Method("plugin", PLUGINS_SPECDEC, needs_draft=True,
                            extra_site=f".cache/plugin-{PLUGIN_BEFORE[:7]}/site",
                            commit=PLUGIN_BEFORE),
    "plugin-compare": Method("plugin", PLUGINS_SPECDEC, needs_draft=True,
                             commit_env=COMPARE_COMMIT_ENV),
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
    # The plugin's draft model at a fixed k (every round drafts k).
    Entry("plugin", "plugin", K_SWEEP, specdec={"method": "draft", "adaptive": False}),
    Entry("plugin-vocab", "plugin", (4,), specdec={"method": "draft", "adaptive": False,
                                                   "draft_vocab": "{draft}/draft_vocab.json"}),
    # The default: hybrid + adaptive. Ceilings 4-32: the sweep that set tuning.K_CEILING.
    Entry("plugin-hybrid-adaptive", "plugin", (4, 8, 16, 32),
          specdec={"method": "hybrid", "adaptive": True}),
    # Looser latency limits: what holding every request's time per token and first
    # token costs in throughput, in one run.
    Entry("plugin-hybrid-adaptive-tpot110", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "tpot_limit": 1.10}),
    Entry("plugin-hybrid-adaptive-unbounded", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "tpot_limit": 100.0,
                   "ttft_limit": 100.0}),
    # The draft proposes only from the pair's draft_vocab.json (the real pair ships one:
    # 16,384 of 49,152 ids), so its head computes a third of the logits.
    Entry("plugin-hybrid-adaptive-vocab", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "draft_vocab": "{draft}/draft_vocab.json"}),
    # Adaptive n-gram drafting alone (no draft model): against hybrid, what the draft
    # model costs and buys.
    Entry("plugin-ngram-adaptive", "plugin-nodraft", (8,), specdec={"method": "ngram"}),
    # One corpus and one set of acceptance statistics for every request (single
    # tenant): against the default per-salt scope it prices tenant isolation.
    Entry("plugin-hybrid-adaptive-global", "plugin", (8,),
          specdec={"method": "hybrid", "adaptive": True, "ngram_corpus_scope": "global"}),
    # The plugin as of PLUGIN_BEFORE with that commit's plugin-hybrid-adaptive options
    # (its own defaults for the rest): kept apart, so edits to today's entries or option
    # names leave it as it was.
    Entry("plugin-before-hybrid-adaptive", "plugin-before", (8,),
          specdec={"method": "hybrid", "adaptive": True}),
    # The plugin as of ``--compare-commit`` with today's default options: one change
    # measured beside the commit before it, in one run.
    Entry("plugin-compare-hybrid-adaptive", "plugin-compare", (8,),
          specdec={"method": "hybrid", "adaptive": True}),
]

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
        m = METHODS[self.method]
        site, commit = m.extra_site, m.commit
        frozen = os.environ.get(m.commit_env or PLUGIN_COMMIT_ENV)
        if m.commit_env and not frozen:
            raise ValueError(f"{self.name} serves the plugin as of another commit. "
                             f"Fix: pass --compare-commit REV.")
        if frozen and not site and m.kind == "plugin":
            # the plugin as of one commit, so that the tree may change during a run
            site, commit = f".cache/plugin-{frozen[:7]}/site", frozen
        if site:
            path = repo / site
            if commit and not path.is_dir():
                export_package(repo, commit, path)
            if not path.is_dir():
                raise FileNotFoundError(f"{self.name} needs {path}, which is missing. "
                                        f"Fix: run `bash scripts/install_suffix.sh` first.")
            env["PYTHONPATH"] = os.pathsep.join(
                [str(path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        return env

    def speculative_config(self, draft: str | None) -> dict | None:
        """The ``--speculative-config`` of its server (None without speculation)."""
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


def export_package(repo: Path, commit: str, site: Path) -> None:
    """``vllm_specdec_plugin`` as of ``commit`` into ``site`` (``git archive``), through a
    temporary folder so that an interrupted export leaves nothing."""
    tmp = site.with_name(site.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(repo), "archive", commit, "vllm_specdec_plugin"],
                         check=True, stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar, check=True)
    tmp.rename(site)


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

