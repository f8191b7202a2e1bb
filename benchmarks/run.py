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

import datetime as dt
import json
import os
import random
import sys
import time

from benchmarks import analysis, machine, report
from benchmarks.configs import BenchConfig
from benchmarks.engines import ENGINE_ENV, Engine, EngineError
from benchmarks.run_plan import Plan, build_parser, make_plan, plan_groups

# A run is flagged when other processes used more than this many CPUs on average.
CONTENDED_CPUS = 0.25


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
