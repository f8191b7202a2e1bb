"""Online serving benchmark: real ``vllm serve`` processes, load from ``vllm bench serve``.

``python -m benchmarks.serving [--smoke] [--pair bench] [--configs ...] [--out DIR]``

Every configuration (``configs.TABLE`` names: ``nospec``, ``draft_model-k4``,
``ngram-k4``, ``plugin-k4``, ``plugin-hybrid-adaptive-k8``, the A/A control
``nospec-again``, ...) is one ``vllm serve``
process, started with the settings users get (torch.compile on unless ``--eager``)
and with ``VLLM_PLUGINS`` loading our plugin only where it is the method under test.
The load generator is vLLM's own ``vllm bench serve``: closed-loop fixed concurrencies
(``--max-concurrency``) and open-loop Poisson rates (``--request-rate``), on two
workloads (``WORKLOADS``):

* ``sharegpt``: real chat traffic. Held-out ShareGPT first exchanges
  (``workloads.sharegpt_pool``) through vLLM's own ShareGPT loader on
  ``/v1/chat/completions`` with the model's chat template; each answer stops at EOS or
  at its reference length (cut to ``--output-len``). Every load of a repetition draws
  new conversations.
* ``sharegpt-t07`` and ``sharegpt-t07-seeded``: the same, sampled at temperature 0.7
  with top-p 0.9 (``serving_client.SAMPLING``), the second with a seed in every request.
  At one load the ``sharegpt*`` workloads send the same conversations (paired: greedy,
  sampled and seeded on the same prompts), each with its own ``cache_salt``, so a
  server shares no prefix-cache block or n-gram corpus between them.
* ``unique``: held-out code prompts, also never sent twice (fair to methods with a
  cross-request cache, such as in-tree ``suffix``).
* ``mixed`` and ``chat``: **replays**. ``vllm bench serve`` cycles the 8 shipped mixed
  prompts (``/v1/completions``, and as chat). Cross-request methods draft the repeats
  from earlier answers; these cells show what replayed traffic gets, never what a
  first-time prompt gets.

Schedule: each repetition starts every server afresh, one at a time in a shuffled
order, and warms it; then runs every (workload, load) cell in a shuffled order, every
server in a shuffled order, so a configuration and its baseline are measured minutes
apart; then stops them all. Only one server has load at any moment; the others idle.
Fresh processes per repetition because one process's speed is partly luck of its
start: on this project's CPU machines two identical servers differed by 7-15 % for
their whole lives, the slower one the first started, or one restarted in its place
(``results/2026-11-27-356e7a6-serving-bench-aa-start-order/``). Restarting in a
new order each repetition turns that into spread between repetitions, which the A/A
control shows, instead of a bias that stays with one configuration. The CPU used by
anything else during a cell is recorded (``foreign_cpus``) and cells above 0.25 CPUs
are flagged.

Writes ``serving.json`` (one cell per run of ``vllm bench serve``: vLLM's own result
keys, tagged with config, workload, max_concurrency or request_rate, repetition),
``serving.md`` and plots (``serving_report.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import json
import os
import random
import time
from pathlib import Path

from benchmarks import machine, serving_report
from benchmarks.configs import expand, select
from benchmarks.serving_client import (WORKLOADS, Load, _children_cpu_s, bench, is_sharegpt,
                                       write_dataset, write_prompts)
from benchmarks.serving_server import LATENCY_SERIES, REPO, Server
from benchmarks.workloads import (load_prompt_set, output_lengths, sharegpt_pool,
                                  unique_code_prompts)

FULL = dict(configs=["nospec-again", "draft_model-k4", "ngram-k4", "suffix-k8", "suffix-k24",
                     "plugin-k4", "plugin-hybrid-adaptive-k8"],
            concurrency=[1, 2, 4, 8, 16, 32, 64], rates=[0.5, 1, 2, 4, 8], reps=2, output_len=64)
SMOKE = dict(configs=["plugin-hybrid-adaptive-k8"], concurrency=[1, 2], rates=[4.0], reps=1,
             output_len=16)
WORKLOADS_DEFAULT = "sharegpt,mixed,chat"
CONTENDED_CPUS = 0.25


def serves(name: str, load: Load, only_at: list) -> bool:
    """Whether configuration ``name`` runs the cells of ``load`` (``--only-at``)."""
    return all([load.kind, load.value] in at for globs, at in only_at
               if any(fnmatch.fnmatchcase(name, g) for g in globs))


def run(args: argparse.Namespace) -> dict:
    from specdec_fixtures import ensure_pair

    configs = select(expand(), args.configs)
    for globs, _ in args.only_at:
        select(configs, globs)   # a glob that names no configuration of the run is an error
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    dataset = out / "mixed.jsonl"
    per_load = min(args.num_prompts, write_dataset(dataset) * 8)
    loads = [Load("max_concurrency", c) for c in args.concurrency] + \
            [Load("request_rate", r) for r in args.rates]
    cells = [(w, ld) for w in args.workloads for ld in loads]
    unique = unique_code_prompts() if "unique" in args.workloads else []
    pair = ensure_pair(args.pair)
    target, draft = str(pair.target), str(pair.draft)
    chats = (sharegpt_pool(target, args.output_len, args.max_model_len, args.seed,
                           args.output_spread)
             if any(map(is_sharegpt, args.workloads)) else [])
    chat_loads = {(ld.kind, ld.value): ld for w, ld in cells if is_sharegpt(w)}  # share chats
    for name, pool, need in (
            ("unique", unique, sum(ld.num_prompts(per_load) for w, ld in cells if w == "unique")),
            ("sharegpt", chats, sum(ld.num_prompts(per_load) for ld in chat_loads.values()))):
        need *= args.reps
        if need > len(pool):
            raise SystemExit(f"the {name} workload needs {need} prompts and has {len(pool)}: "
                             f"use fewer loads or repetitions, or a lower --num-prompts")
    meter = machine.ForeignLoad()
    servers: list[Server] = []
    res: dict = {"meta": {"started": dt.datetime.now().isoformat(timespec="seconds"),
                          "pair": args.pair, "target": target, "draft": draft,
                          "args": {k: (str(v) if isinstance(v, Path) else v)
                                   for k, v in vars(args).items()},
                          "machine": machine.machine_info(), "git": machine.git_info(),
                          "versions": machine.versions()},
                 "cells": []}

    def start_all(rep: int) -> None:
        """Every configuration's server into ``servers``, started one at a time (CPU
        compiles are slow when they overlap) in a shuffled order, then warmed at
        concurrency 1 (first requests pay one-time costs; not recorded)."""
        order = list(configs)
        rng.shuffle(order)
        res["meta"].setdefault("start_order", []).append([c.name for c in order])
        for c in order:
            s = Server(c, target, draft, args, out / f"serve-{c.name}-rep{rep}.log")
            servers.append(s)
            s.wait_ready(args.start_timeout)
            print(f"[serving] rep {rep}: {c.name} ready on port {s.port}", flush=True)
        meter.mine = {os.getpid()}   # this process and this repetition's servers only
        for s in servers:
            meter.mine |= s.pids()
            bench(s, "mixed", Load("max_concurrency", 1), 2, args, dataset, out / "warmup.json",
                  target)

    def stop_all() -> None:
        while servers:
            servers.pop().stop()

    rng = random.Random(args.seed)
    try:
        lengths_rng = random.Random(args.seed + 1)   # its own stream: cell order unchanged

        def _lengths(n: int) -> list[int] | None:
            return (output_lengths(n, args.output_len, args.output_spread, lengths_rng)
                    if args.output_spread else None)

        mixed = load_prompt_set("mixed")
        for rep in range(args.reps):
            start_all(rep)
            rng.shuffle(cells)
            rep_chats: dict[tuple, list] = {}   # per load: the conversations its workloads send
            for workload, load in cells:
                n, data = load.num_prompts(per_load), dataset
                if workload == "unique":   # this cell's own prompts, the same for every server
                    data = write_prompts(out / "cell.jsonl", unique[:n], _lengths(n))
                    unique = unique[n:]
                elif is_sharegpt(workload):
                    key = (load.kind, load.value)
                    if key not in rep_chats:
                        rep_chats[key], chats = chats[:n], chats[n:]
                    data = out / "cell.json"
                    data.write_text(json.dumps(rep_chats[key], ensure_ascii=False))
                elif args.output_spread:   # each request its own length: n lines, no resampling
                    data = write_prompts(out / "cell.jsonl", [mixed[i % len(mixed)] for i in range(n)],
                                         _lengths(n))
                order = list(servers)
                rng.shuffle(order)
                order = [s for s in order if serves(s.name, load, args.only_at)]
                for s in order:
                    meter.wait_quiet(args.wait_quiet_s)
                    mark, client0 = meter.start(), _children_cpu_s()
                    spec0, cpu0 = s.spec_counters(), s.cpu_seconds()
                    cell = bench(s, workload, load, n, args, data, out / "last.json", target,
                                 varied=bool(args.output_spread))
                    cpu1, spec1 = s.cpu_seconds(), s.spec_counters()   # scrape not counted
                    delta = {k: round(spec1.get(k, 0.0) - spec0.get(k, 0.0), 6)
                             for k in {**spec0, **spec1}}
                    cell["first_token"] = {k: delta.pop(k) for k in LATENCY_SERIES.values()}
                    cell["spec"] = delta
                    # where the server's CPU went (API, EngineCore, worker), per cell
                    cell["server_cpu_s"] = {k: round(cpu1[k] - cpu0[k], 3) for k in cpu0}
                    # The load generator is ours too: its CPU (a reaped child) is not foreign.
                    wall = max(time.monotonic() - mark[0], 1e-6)
                    foreign = max(0.0, meter.cpu_share(mark) - (_children_cpu_s() - client0) / wall)
                    cell.update({"config": s.name, "workload": workload, load.kind: load.value,
                                 "repetition": rep, "foreign_cpus": round(foreign, 3),
                                 "contended": foreign > CONTENDED_CPUS})
                    res["cells"].append(cell)
                    print(f"[serving] rep {rep} {workload} {load.kind}={load.value} {s.name}: "
                          f"{cell.get('output_throughput', 0):.1f} tok/s, TPOT p50 "
                          f"{cell.get('median_tpot_ms', 0):.1f} ms", flush=True)
                    (out / "serving.json").write_text(json.dumps(res, indent=1))
            stop_all()
    finally:
        stop_all()
        for f in ("last.json", "warmup.json", "cell.jsonl", "cell.json"):
            (out / f).unlink(missing_ok=True)
    res["meta"]["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    (out / "serving.json").write_text(json.dumps(res, indent=1))
    serving_report.write_all(res, out)
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="CI harness check: ci pair, eager, 2 configs, 2 concurrencies, 1 rate, 1 rep")
    ap.add_argument("--pair", default=None,
                    help="model pair: bench (default), nopay, smol (real weights), ci (default with --smoke)")
    ap.add_argument("--configs", default=None, help="comma-separated table names (nospec always)")
    ap.add_argument("--only-at", action="append", default=[], metavar="CONFIGS=LOADS",
                    help="serve the configurations these globs name only at these loads "
                         "(cN: concurrency N, rX: X req/s), e.g. 'ngram-k4,draft_model-k4=c1'; "
                         "repeatable")
    ap.add_argument("--workloads", default=WORKLOADS_DEFAULT,
                    help=f"comma-separated, of {list(WORKLOADS)}; "
                         f"{list(serving_report.REPLAYED)} are replays")
    ap.add_argument("--concurrency", default=None,
                    help="comma-separated, e.g. 1,2,4,8,16,32,64; '' for none (rates only)")
    ap.add_argument("--rates", default=None, help="Poisson request rates (req/s); '' for none")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--num-prompts", type=int, default=16, help="requests per cell (at least)")
    ap.add_argument("--output-len", type=int, default=None)
    ap.add_argument("--output-spread", type=float, default=0.0,
                    help="vary each request's output length uniformly over "
                         "output-len x [1 - s, 1 + s] (0: every request output-len tokens; "
                         "sharegpt: each reference answer cut at its own such length)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="every workload's but the sampled ones' (sharegpt-t07*: their own)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32",
                    help="float32 on AVX2-only CPUs (bf16 falls back to slow GEMMs there)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--kv-cache-gib", type=float, default=1.0,
                    help="KV cache per server (GiB; vLLM's --kv-cache-memory-bytes); every server "
                         "of a run is up at once, so 0.5 lets 6 bench servers fit in 24 GiB "
                         "(bench: 32 KiB a token)")
    ap.add_argument("--eager", action="store_true", help="--enforce-eager (default: compiled, as users run)")
    ap.add_argument("--no-chunked-prefill", action="store_true",
                    help="--no-enable-chunked-prefill on every server: vLLM 0.32 on CPU without "
                         "the plugin crashes on a seeded request whose prompt is chunked "
                         "(its CPU generator has no offset to rewind)")
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--cell-timeout", type=float, default=1800)
    ap.add_argument("--wait-quiet-s", type=float, default=30)
    ap.add_argument("--plugin-commit", default=None, metavar="REV",
                    help="serve the plugin configurations from the package as of REV (exported "
                         "to .cache/plugin-SHA), so the working tree may change during the run")
    ap.add_argument("--compare-commit", default=None, metavar="REV",
                    help="serve the plugin-compare-* configurations from the package as of REV")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    import subprocess

    from benchmarks.configs import COMPARE_COMMIT_ENV, PLUGIN_COMMIT_ENV

    for rev, env in ((a.plugin_commit, PLUGIN_COMMIT_ENV), (a.compare_commit, COMPARE_COMMIT_ENV)):
        if rev:
            os.environ[env] = subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--verify", rev + "^{commit}"],
                check=True, capture_output=True, text=True).stdout.strip()
    d = SMOKE if a.smoke else FULL
    a.pair = a.pair or ("ci" if a.smoke else "bench")
    a.eager = a.eager or a.smoke
    a.configs = (a.configs.split(",") if a.configs else d["configs"])
    a.workloads = a.workloads.split(",")
    unknown = [w for w in a.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; have {list(WORKLOADS)}")
    a.concurrency = ([int(x) for x in a.concurrency.split(",") if x] if a.concurrency is not None
                     else d["concurrency"])
    a.rates = ([float(x) for x in a.rates.split(",") if x] if a.rates is not None else d["rates"])
    kinds = {"c": "max_concurrency", "r": "request_rate"}
    try:   # [[globs], [[kind, value], ...]] per --only-at (JSON-friendly, for serving.json)
        a.only_at = [[globs.split(","), [[kinds[x[0]], float(x[1:])] for x in loads.split(",")]]
                     for globs, loads in (o.split("=") for o in a.only_at)]
    except (KeyError, ValueError, IndexError):
        ap.error("--only-at takes CONFIGS=LOADS, e.g. 'ngram-k4,draft_model-k4=c1' or 'suffix-*=c1,r2'")
    if not a.concurrency and not a.rates:
        ap.error("no load: give --concurrency or --rates (e.g. --concurrency 8 or --rates 0.5)")
    a.reps = a.reps or d["reps"]
    a.output_len = a.output_len or d["output_len"]
    if not 0.0 <= a.output_spread < 1.0:
        ap.error(f"--output-spread {a.output_spread}: use a value in [0, 1), e.g. 0.5")
    if a.kv_cache_gib <= 0:
        ap.error(f"--kv-cache-gib {a.kv_cache_gib}: use a positive size in GiB, e.g. 1 or 0.5")
    if a.smoke:   # a harness check, never a measurement: no waiting for a quiet machine
        a.num_prompts, a.wait_quiet_s = min(a.num_prompts, 4), 0.0
    if a.out is None:
        stamp = dt.date.today().isoformat()
        sha = machine.git_info().get("short") or "nogit"
        a.out = REPO / "results" / f"{stamp}-{sha}-serving{'-smoke' if a.smoke else ''}"
    return a


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
