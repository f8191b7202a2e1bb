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
  at its reference length (cut to ``--output-len``). Every cell draws new
  conversations, so no server sees a prompt twice.
* ``unique``: held-out code prompts, also never sent twice (fair to methods with a
  cross-request cache, such as in-tree ``suffix``).
* ``mixed`` and ``chat``: **replays**. ``vllm bench serve`` cycles the 8 shipped mixed
  prompts (``/v1/completions``, and as chat). Cross-request methods draft the repeats
  from earlier answers; these cells show what replayed traffic gets, never what a
  first-time prompt gets.

Schedule: all servers of the run are started and warmed first; then for each
repetition, every (workload, load) cell in a shuffled order, every server in a
shuffled order, so a configuration and its baseline are measured minutes apart. Only
one server has load at any moment; the others idle. The CPU used by anything else
during a cell is recorded (``foreign_cpus``) and cells above 0.25 CPUs are flagged.

Writes ``serving.json`` (one cell per run of ``vllm bench serve``: vLLM's own result
keys, tagged with config, workload, max_concurrency or request_rate, repetition),
``serving.md`` and plots (``serving_report.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from benchmarks import machine, serving_report
from benchmarks.configs import BenchConfig, expand, select
from benchmarks.workloads import load_prompt_set, sharegpt_pool, unique_code_prompts
from specdec_testing import stop_process_group

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# vLLM's result keys kept per cell (the per-request lists are dropped).
DROP_KEYS = ("ttfts", "itls", "input_lens", "output_lens", "generated_texts", "errors",
             "start_times")
# name -> (vllm bench serve backend, endpoint). "unique" and "sharegpt": each prompt sent
# once per server in the whole run; "mixed" and "chat" cycle 8 prompts (replays).
WORKLOADS = {"mixed": ("openai", "/v1/completions"), "chat": ("openai-chat", "/v1/chat/completions"),
             "unique": ("openai", "/v1/completions"),
             "sharegpt": ("openai-chat", "/v1/chat/completions")}
FULL = dict(configs=["nospec-again", "draft_model-k4", "ngram-k4", "suffix-k8", "suffix-k24",
                     "plugin-k4", "plugin-hybrid-adaptive-k8"],
            concurrency=[1, 2, 4, 8, 16, 32, 64], rates=[0.5, 1, 2, 4, 8], reps=2, output_len=64)
SMOKE = dict(configs=["plugin-hybrid-adaptive-k8"], concurrency=[1, 2], rates=[4.0], reps=1,
             output_len=16)
WORKLOADS_DEFAULT = "sharegpt,mixed,chat"
CONTENDED_CPUS = 0.25
# /metrics series summed over label sets before and after each cell; their deltas give
# the cell's acceptance (vLLM's counters, every method) and draft cost (the plugin's).
SPEC_SERIES = {"vllm:spec_decode_num_drafts_total": "drafts",
               "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
               "vllm:spec_decode_num_accepted_tokens_total": "accepted",
               "specdec_draft_step_seconds_sum": "draft_s",
               "specdec_draft_step_seconds_count": "draft_rounds"}
# The plugin's shadow n-gram drafts (label outcome="drafted"|"accepted"): "shadow_<outcome>".
SHADOW_SERIES = "specdec_shadow_draft_tokens_total"
# The plugin's step plan (label outcome="kept"|"cut"): "plan_<outcome>", draft tokens of
# steps that carried a prompt, verified or cut before verification.
PLAN_SERIES = "specdec_step_plan_verify_tokens_total"
# The plugin's decode steps by kind (labels kind="verify"|"plain"): "<kind>_<field>".
# Their means show what a verifying step costs over a plain one at the cell's load.
STEP_SERIES = {"specdec_target_step_seconds_sum": "step_s",
               "specdec_target_step_seconds_count": "steps",
               "specdec_emitted_tokens_total": "emitted"}


@dataclass
class Load:
    """One load point: a fixed concurrency (closed loop) or a Poisson rate (req/s)."""

    kind: str        # "max_concurrency" | "request_rate"
    value: float

    def args(self) -> list[str]:
        if self.kind == "max_concurrency":
            return ["--max-concurrency", str(int(self.value))]
        return ["--request-rate", str(self.value)]

    def num_prompts(self, per_load: int) -> int:
        """Enough requests to reach steady state at this load (at least ``per_load``)."""
        return max(per_load, 4 * int(self.value)) if self.kind == "max_concurrency" \
            else max(per_load, int(round(8 * self.value)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``vllm serve`` process for one configuration."""

    def __init__(self, config: BenchConfig, target: str, draft: str | None, args: argparse.Namespace,
                 log: Path):
        self.config, self.port = config, _free_port()
        self.name = config.name
        cmd = [str(BIN / "vllm"), "serve", target, "--host", "127.0.0.1", "--port", str(self.port),
               "--served-model-name", self.name, "--max-model-len", str(args.max_model_len),
               "--dtype", args.dtype, "--seed", "0"]
        if args.eager:
            cmd.append("--enforce-eager")
        spec = config.speculative_config(draft)
        if spec is not None:
            cmd += ["--speculative-config", json.dumps(spec)]
        env = {**os.environ, **SERVER_ENV, **config.engine_env(REPO)}
        self.log = open(log, "w")
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def pids(self) -> set[int]:
        """The server's process tree (API server, engine core), for the foreign-load meter."""
        out, todo = set(), [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.add(pid)
            try:
                for t in Path(f"/proc/{pid}/task").iterdir():
                    children = (t / "children").read_text().split()
                    todo += [int(c) for c in children if int(c) not in out]
            except OSError:
                pass
        return out

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of the API server process, the engine
        core, its model-runner worker, and any other process of the server's tree."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {"api": 0.0, "engine": 0.0, "worker": 0.0, "other": 0.0}
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue   # exited meanwhile
            role = ("api" if pid == self.proc.pid else "engine" if b"EngineCore" in title
                    else "worker" if b"Worker" in title else "other")
            out[role] += (int(fields[11]) + int(fields[12])) / tick   # utime, stime
        return out

    def wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: vllm serve exited {self.proc.returncode} "
                                   f"(log: {self.log.name})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(2)
        raise TimeoutError(f"{self.name}: not healthy after {timeout:.0f} s (log: {self.log.name})")

    def stop(self) -> None:
        stop_process_group(self.proc, signal.SIGINT, 60)
        self.log.close()

    def spec_counters(self) -> dict[str, float]:
        """SPEC_SERIES, STEP_SERIES, SHADOW_SERIES and PLAN_SERIES from the server's /metrics (0 for a
        series it does not export)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = dict.fromkeys(SPEC_SERIES.values(), 0.0)
        out.update({f"{kind}_{f}": 0.0 for kind in ("verify", "plain") for f in STEP_SERIES.values()})
        out.update(shadow_drafted=0.0, shadow_accepted=0.0, plan_kept=0.0, plan_cut=0.0)
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in SPEC_SERIES:
                out[SPEC_SERIES[name]] += float(line.rsplit(" ", 1)[1])
            elif name in STEP_SERIES:
                kind = "verify" if 'kind="verify"' in line else "plain"
                out[f"{kind}_{STEP_SERIES[name]}"] += float(line.rsplit(" ", 1)[1])
            elif name == SHADOW_SERIES:
                outcome = "accepted" if 'outcome="accepted"' in line else "drafted"
                out[f"shadow_{outcome}"] += float(line.rsplit(" ", 1)[1])
            elif name == PLAN_SERIES:
                outcome = "cut" if 'outcome="cut"' in line else "kept"
                out[f"plan_{outcome}"] += float(line.rsplit(" ", 1)[1])
        return out


def _children_cpu_s() -> float:
    """CPU seconds of this process's reaped children (the ``vllm bench serve`` clients)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def write_prompts(path: Path, prompts: list[str], lengths: list[int] | None = None) -> Path:
    """``prompts`` as vLLM's ``custom`` dataset (JSONL, one "prompt" per line), with
    each request's ``output_tokens`` when ``lengths`` is given."""
    rows = [{"prompt": p} for p in prompts]
    for row, n in zip(rows, lengths or []):
        row["output_tokens"] = n
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def output_lengths(n: int, mean: int, spread: float, rng: random.Random) -> list[int]:
    """``n`` output lengths drawn uniformly from mean·[1 - spread, 1 + spread] (at least 2).

    With fixed lengths, a closed loop keeps its requests in lockstep: without
    speculation they finish, and restart, together. Real traffic has varied lengths.
    """
    return [max(2, round(mean * rng.uniform(1 - spread, 1 + spread))) for _ in range(n)]


def write_dataset(path: Path) -> int:
    """The mixed prompt set as vLLM's ``custom`` dataset (JSONL, one "prompt" per line)."""
    prompts = load_prompt_set("mixed")
    write_prompts(path, prompts)
    return len(prompts)


def _dataset_args(workload: str, dataset: Path, args: argparse.Namespace, varied: bool) -> list[str]:
    if workload == "sharegpt":
        # vLLM's loader: output length = the (cut) reference answer's; the answer stops
        # at EOS as real chat does (greedy outputs are the same for every method).
        return ["--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--no-oversample"]
    return ["--dataset-name", "custom", "--dataset-path", str(dataset),
            # raw prompts: /v1/completions takes them as they are, and the chat endpoint
            # applies the server's template itself (the client must not apply it too)
            "--skip-chat-template",
            # -1: each request's length from the dataset's "output_tokens"
            "--custom-output-len", str(-1 if varied else args.output_len), "--ignore-eos"]


def bench(server: Server, workload: str, load: Load, num_prompts: int, args: argparse.Namespace,
          dataset: Path, result: Path, tokenizer: str, varied: bool = False) -> dict:
    """One ``vllm bench serve`` run against ``server``; returns vLLM's result dict.

    varied: ``dataset`` gives each request its ``output_tokens`` (``output_lengths``).
    """
    backend, endpoint = WORKLOADS[workload]
    cmd = [str(BIN / "vllm"), "bench", "serve", "--backend", backend, "--endpoint", endpoint,
           "--base-url", f"http://127.0.0.1:{server.port}", "--model", server.name,
           "--tokenizer", tokenizer, *_dataset_args(workload, dataset, args, varied),
           "--num-prompts", str(num_prompts),
           "--temperature", str(args.temperature), "--seed", str(args.seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name,
           *load.args()]
    env = {**os.environ, **SERVER_ENV, "VLLM_PLUGINS": ""}   # the client loads no plugin
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.cell_timeout)
    if p.returncode != 0 or not result.exists():
        raise RuntimeError(f"vllm bench serve failed ({p.returncode}) for {server.name} "
                           f"{workload} {load}:\n{(p.stdout + p.stderr)[-3000:]}")
    out = json.loads(result.read_text())
    cell = {k: v for k, v in out.items() if k not in DROP_KEYS}
    # vLLM writes both load keys ("inf" / None for the unused one); a cell carries only
    # the one it was measured at (set by the caller), vLLM's values kept under client_.
    for key in ("request_rate", "max_concurrency"):
        cell[f"client_{key}"] = cell.pop(key, None)
    return cell


def run(args: argparse.Namespace) -> dict:
    from specdec_fixtures import ensure_pair

    configs = select(expand(), args.configs)
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
    chats = (sharegpt_pool(target, args.output_len, args.max_model_len, args.seed)
             if "sharegpt" in args.workloads else [])
    for name, pool in (("unique", unique), ("sharegpt", chats)):
        need = args.reps * sum(ld.num_prompts(per_load) for w, ld in cells if w == name)
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
    try:
        for c in configs:   # started one at a time: CPU compiles are slow when they overlap
            s = Server(c, target, draft, args, out / f"serve-{c.name}.log")
            servers.append(s)
            s.wait_ready(args.start_timeout)
            print(f"[serving] {c.name} ready on port {s.port}", flush=True)
        for s in servers:
            meter.mine |= s.pids()
            # Warm-up at concurrency 1 (first requests pay one-time costs); not recorded.
            bench(s, "mixed", Load("max_concurrency", 1), 2, args, dataset, out / "warmup.json",
                  target)
        rng = random.Random(args.seed)
        lengths_rng = random.Random(args.seed + 1)   # its own stream: cell order unchanged

        def _lengths(n: int) -> list[int] | None:
            return (output_lengths(n, args.output_len, args.output_spread, lengths_rng)
                    if args.output_spread else None)

        mixed = load_prompt_set("mixed")
        for rep in range(args.reps):
            rng.shuffle(cells)
            for workload, load in cells:
                n, data = load.num_prompts(per_load), dataset
                if workload == "unique":   # this cell's own prompts, the same for every server
                    data = write_prompts(out / "cell.jsonl", unique[:n], _lengths(n))
                    unique = unique[n:]
                elif workload == "sharegpt":
                    data = out / "cell.json"
                    data.write_text(json.dumps(chats[:n], ensure_ascii=False))
                    chats = chats[n:]
                elif args.output_spread:   # each request its own length: n lines, no resampling
                    data = write_prompts(out / "cell.jsonl", [mixed[i % len(mixed)] for i in range(n)],
                                         _lengths(n))
                order = list(servers)
                rng.shuffle(order)
                for s in order:
                    meter.wait_quiet(args.wait_quiet_s)
                    mark, client0 = meter.start(), _children_cpu_s()
                    spec0, cpu0 = s.spec_counters(), s.cpu_seconds()
                    cell = bench(s, workload, load, n, args, data, out / "last.json", target,
                                 varied=bool(args.output_spread))
                    cpu1, spec1 = s.cpu_seconds(), s.spec_counters()   # scrape not counted
                    cell["spec"] = {k: round(spec1[k] - spec0[k], 6) for k in spec0}
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
    finally:
        for s in servers:
            s.stop()
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
    ap.add_argument("--workloads", default=WORKLOADS_DEFAULT,
                    help=f"comma-separated, of {list(WORKLOADS)}; "
                         f"{list(serving_report.REPLAYED)} are replays")
    ap.add_argument("--concurrency", default=None, help="comma-separated, e.g. 1,2,4,8,16,32,64")
    ap.add_argument("--rates", default=None, help="Poisson request rates (req/s); '' for none")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--num-prompts", type=int, default=16, help="requests per cell (at least)")
    ap.add_argument("--output-len", type=int, default=None)
    ap.add_argument("--output-spread", type=float, default=0.0,
                    help="vary each request's output length uniformly over "
                         "output-len x [1 - s, 1 + s] (0: every request output-len tokens)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32",
                    help="float32 on AVX2-only CPUs (bf16 falls back to slow GEMMs there)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--eager", action="store_true", help="--enforce-eager (default: compiled, as users run)")
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--cell-timeout", type=float, default=1800)
    ap.add_argument("--wait-quiet-s", type=float, default=30)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    d = SMOKE if a.smoke else FULL
    a.pair = a.pair or ("ci" if a.smoke else "bench")
    a.eager = a.eager or a.smoke
    a.configs = (a.configs.split(",") if a.configs else d["configs"])
    a.workloads = a.workloads.split(",")
    unknown = [w for w in a.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; have {list(WORKLOADS)}")
    a.concurrency = [int(x) for x in a.concurrency.split(",")] if a.concurrency else d["concurrency"]
    a.rates = ([float(x) for x in a.rates.split(",") if x] if a.rates is not None else d["rates"])
    a.reps = a.reps or d["reps"]
    a.output_len = a.output_len or d["output_len"]
    if not 0.0 <= a.output_spread < 1.0:
        ap.error(f"--output-spread {a.output_spread}: use a value in [0, 1), e.g. 0.5")
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
