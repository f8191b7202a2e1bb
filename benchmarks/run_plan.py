"""What a ``benchmarks.run`` run measures: its ``Plan``, from the command line.

``build_parser`` and ``make_plan`` turn the CLI into a ``Plan`` (configurations,
tokenized workloads, temperatures, repetitions, engine settings, pinning);
``plan_groups`` splits the engines into groups that fit in memory together, each
with the ``nospec`` baseline.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import machine
from benchmarks.configs import (QUICK_CONFIGS, QUICK_WORKLOADS, TEMPERATURES, WORKLOADS,
                                BenchConfig, expand, select)
from benchmarks.engines import WORKER_MODULE
from benchmarks.workloads import TokenizedWorkload, tokenize_workloads

DESCRIPTION = "Benchmark entry point: ``python -m benchmarks.run [--quick] [...]`` (see README.md)."
# Memory planned per engine: a margin over the measured peak RSS of one bench-pair
# engine (~2.0-2.5 GiB).
DEFAULT_ENGINE_GIB = 2.75


@dataclass
class Plan:
    """Everything a benchmark run needs; ``run_benchmark`` executes it."""

    configs: list[BenchConfig]
    workloads: dict[str, TokenizedWorkload]
    temps: list[float]
    reps: int
    max_tokens: int
    warmup_tokens: int
    seed: int
    engine_kwargs: dict             # shared LLM kwargs (speculative_config added per config)
    target: str
    draft: str | None
    out: Path
    group_size: int                 # engines alive at once (baseline included)
    engine_gib: float
    wait_quiet_s: float
    args: dict = field(default_factory=dict)
    extra_env: dict = field(default_factory=dict)
    worker_module: str = WORKER_MODULE
    worker_args: tuple[str, ...] = ()
    engine_cpus: list[int] | None = None    # pin engines here (None: leave unpinned)
    engine_threads: int | None = None       # OMP_NUM_THREADS for engines (None: default)
    progress: bool = True


def plan_groups(configs: list[BenchConfig], group_size: int) -> list[list[BenchConfig]]:
    """Split configurations into groups of at most ``group_size`` engines, each with
    the baseline. Configurations are ordered by k first, so e.g. plugin-k4 and
    draft_model-k4 share a group and their head-to-head is paired tightly too."""
    bases = [c for c in configs if c.is_baseline]
    if len(bases) != 1:
        raise ValueError("exactly one baseline (nospec) configuration is required")
    base = bases[0]
    order = {c.name: i for i, c in enumerate(configs)}
    # By k, so same-k methods share a group; k = 0 (the A/A control) last: it pairs
    # with the baseline only and must not push a same-k pair across a group boundary.
    others = sorted((c for c in configs if not c.is_baseline),
                    key=lambda c: (c.k == 0, c.k, order[c.name]))
    per = max(1, group_size - 1)
    chunks = [others[i:i + per] for i in range(0, len(others), per)] or [[]]
    return [[base] + sorted(ch, key=lambda c: order[c.name]) for ch in chunks]


def _default_out() -> Path:
    sha = machine.git_info().get("short") or "nogit"
    base = machine.REPO / "results" / f"{dt.date.today().isoformat()}-{sha}"
    out, i = base, 2
    while (out / "results.json").exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out


def _csv(s: str | None) -> list[str] | None:
    return [x.strip() for x in s.split(",") if x.strip()] if s else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=DESCRIPTION,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"harness smoke run: configs {','.join(QUICK_CONFIGS)}, workloads "
                        f"{','.join(QUICK_WORKLOADS)}, 3 reps, 32 tokens (< 10 min on 2 cores)")
    p.add_argument("--pair", default="bench", choices=["bench", "nopay", "ci"], help="fixture pair")
    p.add_argument("--target", help="local target model folder (overrides --pair)")
    p.add_argument("--draft", help="local draft model folder (same tokenizer as the target)")
    p.add_argument("--configs", help="comma-separated names or globs (e.g. 'plugin-*,ngram-k4'); "
                                     "nospec is always included")
    p.add_argument("--workloads", help=f"comma-separated subset of {','.join(WORKLOADS)}")
    p.add_argument("--temps", help="comma-separated temperatures (default 0,0.8)")
    p.add_argument("--reps", type=int, help="repetitions (default 5; quick 3)")
    p.add_argument("--max-tokens", type=int, help="new tokens per request (default 128; quick 32)")
    p.add_argument("--warmup-tokens", type=int, help="tokens per warm-up request (default 16; quick 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default=None, help="engine dtype (default: the target's config dtype)")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--out", type=Path, help="results folder (default results/<date>-<shortsha>/)")
    p.add_argument("--mem-budget-gib", type=float, default=18.0,
                   help="memory the live engines may use together; sets the group size")
    p.add_argument("--engine-gib", type=float, default=DEFAULT_ENGINE_GIB,
                   help="memory assumed per engine when planning groups")
    p.add_argument("--wait-quiet", type=float, default=None,
                   help="before each run, wait up to this many seconds while other processes "
                        "use CPU (0 = don't wait; default 120, quick 5); contended runs are "
                        "flagged either way")
    p.add_argument("--engine-cpus", default="0",
                   help="CPUs each engine is pinned to, e.g. '0' or '0-1'; 'none' = unpinned. "
                        "Default mirrors vLLM's own CPU binding on a 2-core machine (worker on "
                        "core 0, one OpenMP thread, the other core left to the rest)")
    p.add_argument("--engine-threads", default="1",
                   help="OMP_NUM_THREADS (torch intra-op threads) of each engine; 'none' = default")
    p.add_argument("--compile", action="store_true",
                   help="vLLM's default compilation (no enforce_eager: what `vllm serve` users get); "
                        "engines compile at start-up, before anything is measured")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--report-only", type=Path, metavar="RESULTS_JSON",
                   help="re-render results.md and plots from an existing results.json")
    p.add_argument("--no-progress", action="store_true")
    return p


def make_plan(a: argparse.Namespace) -> Plan:
    if a.quick:
        a.reps = a.reps or 3
        a.max_tokens = a.max_tokens or 32
        a.warmup_tokens = a.warmup_tokens or 8
        cfg_patterns = _csv(a.configs) or list(QUICK_CONFIGS)
        wl_names = _csv(a.workloads) or list(QUICK_WORKLOADS)
    else:
        cfg_patterns = _csv(a.configs)
        wl_names = _csv(a.workloads) or list(WORKLOADS)
    reps, max_tokens = a.reps or 5, a.max_tokens or 128
    if a.wait_quiet is None:
        a.wait_quiet = 5.0 if a.quick else 120.0
    warmup = a.warmup_tokens or 16
    temps = [float(x) for x in _csv(a.temps)] if a.temps else list(TEMPERATURES)
    if a.target:
        target, draft = str(Path(a.target).resolve()), a.draft and str(Path(a.draft).resolve())
    else:
        from specdec_fixtures import ensure_pair

        pair = ensure_pair(a.pair)
        target, draft = str(pair.target), str(a.draft or pair.draft)
    configs = select(expand(), cfg_patterns)
    if draft is None and any(c.method in ("draft_model", "plugin") for c in configs):
        raise SystemExit("--target given without --draft: pass --draft or select configs "
                         "that need no draft (e.g. --configs 'ngram-*')")
    unknown = [w for w in wl_names if w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}; have {list(WORKLOADS)}")
    dtype = a.dtype or _config_dtype(target)
    max_k = max(c.k for c in configs)
    workloads = tokenize_workloads([WORKLOADS[w] for w in wl_names], target,
                                   a.max_model_len - max_tokens - max_k - 2)
    max_batch = max(tw.workload.batch_size for tw in workloads.values())
    engine_kwargs = dict(model=target, dtype=dtype, max_model_len=a.max_model_len,
                         enforce_eager=not a.compile, max_num_seqs=max(max_batch, 32), seed=0,
                         disable_log_stats=False, enable_prefix_caching=False)
    group_size = max(2, math.floor(a.mem_budget_gib / a.engine_gib))
    cpus = None if a.engine_cpus.lower() == "none" else _cpu_list(a.engine_cpus)
    threads = None if str(a.engine_threads).lower() == "none" else int(a.engine_threads)
    args = {"quick": a.quick, "pair": None if a.target else a.pair, "configs": [c.name for c in configs],
            "workloads": wl_names, "temps": temps, "reps": reps, "max_tokens": max_tokens,
            "warmup_tokens": warmup, "seed": a.seed, "dtype": dtype, "max_model_len": a.max_model_len,
            "mem_budget_gib": a.mem_budget_gib, "engine_gib": a.engine_gib, "group_size": group_size,
            "wait_quiet_s": a.wait_quiet, "engine_cpus": cpus, "engine_threads": threads,
            "compile": a.compile, "argv": sys.argv[1:]}
    return Plan(configs=configs, workloads=workloads, temps=temps, reps=reps, max_tokens=max_tokens,
                warmup_tokens=warmup, seed=a.seed, engine_kwargs=engine_kwargs, target=target,
                draft=draft, out=(a.out or _default_out()).resolve(), group_size=group_size,
                engine_gib=a.engine_gib, wait_quiet_s=a.wait_quiet, args=args,
                engine_cpus=cpus, engine_threads=threads,
                progress=not a.no_progress)


def _cpu_list(spec: str) -> list[int]:
    """'0', '0-1', '0,2-3' -> CPU ids."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _config_dtype(model_dir: str) -> str:
    try:
        cfg = json.loads(Path(model_dir, "config.json").read_text())
        return str(cfg.get("torch_dtype") or cfg.get("dtype") or "auto")
    except (OSError, ValueError):
        return "auto"
