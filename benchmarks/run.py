"""Benchmark entry point: ``python -m benchmarks.run [--quick] [...]`` (see README.md).

Runs every configuration of ``configs.TABLE`` (no speculation, vLLM's in-tree
draft_model and ngram, the plugin) on every workload at every temperature,
repeatedly, interleaved, on one machine, and writes results.json, results.md and
PNG plots to ``--out``.

Schedule. Engines that fit in memory together form a *group*; every group holds the
``nospec`` baseline. A group's engines are started once and warmed up; then for each
repetition, for each (workload, temperature) cell in a shuffled order, every engine
of the group runs the cell once, in a shuffled order. So a configuration and its
baseline are measured minutes apart at most, drift hits both alike, and the paired
ratio cancels it. Only one engine computes at any moment.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import analysis, machine, report
from benchmarks.configs import (QUICK_CONFIGS, QUICK_WORKLOADS, TEMPERATURES, WORKLOADS,
                                BenchConfig, expand, select)
from benchmarks.engines import ENGINE_ENV, WORKER_MODULE, Engine, EngineError
from benchmarks.workloads import TokenizedWorkload, tokenize_workloads

DEFAULT_ENGINE_GIB = 2.75
# A run is flagged when other processes used more than this many CPUs on average.
CONTENDED_CPUS = 0.25   # measured peak RSS of one bench-pair engine is ~2.0-2.5 GiB


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


def _params(temp: float, max_tokens: int, n: int, seed: int) -> list[dict] | dict:
    base = {"temperature": temp, "max_tokens": max_tokens, "ignore_eos": True}
    if temp == 0:
        return base
    # Same seeds for every configuration within a repetition (paired), new ones per rep.
    return [{**base, "seed": seed + i} for i in range(n)]


def _seed(plan_seed: int, rep: int, cell: int) -> int:
    return (plan_seed * 1_000_003 + rep * 10_007 + cell * 101) % 2**31


def _wait_memory(need_gib: float, max_wait_s: float = 300.0) -> None:
    t0 = time.monotonic()
    while machine.mem_available_gib() < need_gib:
        if time.monotonic() - t0 > max_wait_s:
            raise EngineError(f"only {machine.mem_available_gib():.1f} GiB available, need "
                              f"{need_gib:.1f} GiB for the next engine; lower --mem-budget-gib, "
                              "raise --engine-gib accuracy, or free memory")
        time.sleep(5)


def _bar(total: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, dynamic_ncols=True,
                smoothing=0.05)


def run_benchmark(plan: Plan) -> dict:
    """Measure everything in ``plan``; write and return the results dict."""
    t_start = time.time()
    started = dt.datetime.now().isoformat(timespec="seconds")
    groups = plan_groups(plan.configs, plan.group_size)
    cells = [(w, t) for w in plan.workloads for t in plan.temps]
    foreign = machine.ForeignLoad()
    runs: list[dict] = []
    engines_meta: dict[str, dict] = {}
    total = sum(len(g) for g in groups) * plan.reps * len(cells)
    res = _results_skeleton(plan, groups, started)
    bar = _bar(total, plan.progress, "runs")
    try:
        for gi, group in enumerate(groups):
            engines: list[Engine] = []
            try:
                for cfg in group:
                    _wait_memory(plan.engine_gib + 0.5)
                    kw = dict(plan.engine_kwargs)
                    spec = cfg.speculative_config(plan.draft)
                    if spec is not None:
                        kw["speculative_config"] = spec
                    e = Engine(cfg, kw, plan.out / "logs" / f"g{gi}-{cfg.name}.log",
                               plan.extra_env, plan.worker_module, plan.worker_args,
                               cpus=plan.engine_cpus, threads=plan.engine_threads)
                    bar.set_postfix_str(f"group {gi}: starting {cfg.name}")
                    if plan.wait_quiet_s:
                        foreign.wait_quiet(plan.wait_quiet_s)
                    e.start()
                    foreign.mine.add(e.pid)
                    engines.append(e)
                by_name = {e.config.name: e for e in engines}
                last: dict[str, dict] = {}
                last_share: float | None = None
                # Warm-up: every cell once per engine, short, unrecorded.
                for e in engines:
                    bar.set_postfix_str(f"group {gi}: warm-up {e.config.name}")
                    if plan.wait_quiet_s:
                        foreign.wait_quiet(plan.wait_quiet_s)
                    for ci, (w, t) in enumerate(cells):
                        tw = plan.workloads[w]
                        r = e.generate(tw.prompts, _params(t, plan.warmup_tokens, len(tw.prompts),
                                                           _seed(plan.seed, 10_000, ci)),
                                       tw.workload.batch_size)
                        last[e.config.name] = r
                    engines_meta[f"{e.config.name}@g{gi}"] = {
                        "config": e.config.name, "group": gi, "vllm_plugins": e.config.vllm_plugins,
                        "plugin_registrations": e.plugin_registrations(), "startup_s": e.startup_s,
                        "pid": e.pid, "torch_threads": e.ready.get("torch_threads"),
                        "cpu_affinity": e.ready.get("cpu_affinity"),
                        "thread_affinities": _affinities(e.pid),
                        "engine_kwargs": e.engine_kwargs}
                for rep in range(plan.reps):
                    rng = random.Random(f"{plan.seed}/{gi}/{rep}")
                    order = list(range(len(cells)))
                    rng.shuffle(order)
                    for ci in order:
                        w, t = cells[ci]
                        tw = plan.workloads[w]
                        cfg_order = list(group)
                        rng.shuffle(cfg_order)
                        for pos, cfg in enumerate(cfg_order):
                            e = by_name[cfg.name]
                            bar.set_postfix_str(f"g{gi} rep {rep} {w} T={t} {cfg.name}")
                            waited = (foreign.wait_quiet(plan.wait_quiet_s, last_share)
                                      if plan.wait_quiet_s else 0.0)
                            mark = foreign.start()
                            load1 = os.getloadavg()[0]
                            r = e.generate(tw.prompts, _params(t, plan.max_tokens, len(tw.prompts),
                                                               _seed(plan.seed, rep, ci)),
                                           tw.workload.batch_size)
                            share = last_share = foreign.cpu_share(mark)
                            prev = last[cfg.name]
                            last[cfg.name] = r
                            n_out = sum(len(o) for o in r["outputs"])
                            runs.append({
                                "group": gi, "rep": rep, "config": cfg.name, "workload": w,
                                "temperature": t, "order": pos, "seconds": r["seconds"],
                                "output_tokens": n_out, "tps": n_out / r["seconds"],
                                "spec": analysis.counter_delta(prev.get("metrics"), r.get("metrics")),
                                "proposer": analysis.proposer_delta(prev.get("proposer"), r.get("proposer")),
                                "timers": r.get("timers"), "outputs": r["outputs"],
                                "outputs_digest": analysis.outputs_digest(r["outputs"]),
                                "foreign_cpu_share": round(share, 3), "contended": share > CONTENDED_CPUS,
                                "waited_for_quiet_s": waited, "loadavg1_before": load1,
                            })
                            bar.update(1)
                for e in engines:
                    engines_meta[f"{e.config.name}@g{gi}"].update(e.memory())
            finally:
                for e in engines:
                    e.close()
            _finish(res, plan, runs, engines_meta, t_start, partial=gi < len(groups) - 1)
    finally:
        bar.close()
    return res


def _affinities(pid: int | None) -> dict:
    from benchmarks.engines import thread_affinities

    return thread_affinities(pid) if pid else {}


def _results_skeleton(plan: Plan, groups: list[list[BenchConfig]], started: str) -> dict:
    configs = [{"name": c.name, "method": c.method, "k": c.k, "family": c.family,
                "is_baseline": c.is_baseline, "vllm_plugins": c.vllm_plugins,
                "speculative_config": c.speculative_config(plan.draft)} for c in plan.configs]
    return {
        "schema": 1,
        "meta": {
            "started": started, "args": plan.args, "target": plan.target, "draft": plan.draft,
            "git": machine.git_info(), "versions": machine.versions(),
            "machine": machine.machine_info(), "thread_settings": machine.thread_settings(),
            "env": machine.relevant_env(),
            "engine_env": {**ENGINE_ENV, **plan.extra_env,
                           "VLLM_PLUGINS": {c.name: c.vllm_plugins for c in plan.configs}},
            "engine_kwargs": plan.engine_kwargs,
            "groups": [[c.name for c in g] for g in groups],
            "schedule": "groups of engines alive together, each with the nospec baseline; per "
                        "repetition the (workload, temperature) cells and, within a cell, the "
                        "engines run in a seeded random order; warm-up once per engine",
        },
        "configs": configs,
        "workloads": [tw.describe() for tw in plan.workloads.values()],
        "runs": [], "summary": [],
    }


def _finish(res: dict, plan: Plan, runs: list[dict], engines_meta: dict, t_start: float,
            partial: bool) -> None:
    cfgs = {c["name"]: c for c in res["configs"]}
    wls = {w["name"]: w for w in res["workloads"]}
    analysis.derive_all(runs, cfgs, wls)
    stored = [{k: v for k, v in r.items() if k != "outputs"} for r in runs]
    res["runs"] = stored
    res["summary"] = analysis.summarize_cells(stored, cfgs)
    res["meta"].update({"engines": engines_meta, "partial": partial,
                        "finished": dt.datetime.now().isoformat(timespec="seconds"),
                        "wall_s": time.time() - t_start,
                        "contended_runs": sum(r["contended"] for r in runs)})
    plan.out.mkdir(parents=True, exist_ok=True)
    (plan.out / "results.json").write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    if not partial:
        report.write_all(res, plan.out)


# ---------------------------------------------------------------------------- CLI

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
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0],
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


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.report_only:
        res = json.loads(a.report_only.read_text())
        for p in report.write_all(res, a.report_only.parent):
            print(p)
        return 0
    plan = make_plan(a)
    groups = plan_groups(plan.configs, plan.group_size)
    n_runs = sum(len(g) for g in groups) * plan.reps * len(plan.workloads) * len(plan.temps)
    print(f"benchmark: {len(plan.configs)} configs in {len(groups)} group(s) "
          f"{[[c.name for c in g] for g in groups]}; workloads {list(plan.workloads)}; temps "
          f"{plan.temps}; {plan.reps} reps; {n_runs} measured runs -> {plan.out}", file=sys.stderr)
    if a.dry_run:
        return 0
    t0 = time.time()
    res = run_benchmark(plan)
    print(f"done in {time.time() - t0:.0f} s; contended runs: {res['meta']['contended_runs']}; "
          f"results in {plan.out}", file=sys.stderr)
    print(plan.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
