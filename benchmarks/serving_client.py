"""The serving benchmark's load: ``vllm bench serve`` runs, and the datasets they read.

``bench`` runs vLLM's own load generator against one ``Server`` at one ``Load`` (a
closed-loop concurrency or a Poisson rate) and returns vLLM's result dict;
``write_prompts`` writes a cell's prompts as vLLM's ``custom`` dataset, with
per-request output lengths (``workloads.output_lengths``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks.serving_server import BIN, SERVER_ENV, Server
from benchmarks.stats import quantile
from benchmarks.workloads import load_prompt_set

# vLLM's result keys dropped per cell: the texts and per-token lists. Per request,
# ttfts, start_times, input_lens and output_lens stay (``--save-detailed``).
DROP_KEYS = ("itls", "generated_texts", "errors")
# name -> (vllm bench serve backend, endpoint). "unique" and the "sharegpt" ones: each prompt
# sent once per server in the whole run; "mixed" and "chat" cycle 8 prompts (replays).
WORKLOADS = {"mixed": ("openai", "/v1/completions"), "chat": ("openai-chat", "/v1/chat/completions"),
             "unique": ("openai", "/v1/completions"),
             "sharegpt": ("openai-chat", "/v1/chat/completions"),
             "sharegpt-t07": ("openai-chat", "/v1/chat/completions"),
             "sharegpt-t07-seeded": ("openai-chat", "/v1/chat/completions")}
# Sampled chat, as chat products sample: each request's own sampling parameters (the other
# workloads take --temperature). "-seeded": every request passes a seed (the same one, so
# each request has its own generator stream: vLLM seeds one per request).
SAMPLING = {"sharegpt-t07": {"temperature": 0.7, "top_p": 0.9},
            "sharegpt-t07-seeded": {"temperature": 0.7, "top_p": 0.9, "seed": 1234}}


def is_sharegpt(workload: str) -> bool:
    """A workload drawing held-out ShareGPT conversations (greedy or sampled)."""
    return workload.startswith("sharegpt")


def _sampling_args(workload: str, args: argparse.Namespace) -> list[str]:
    sampling = SAMPLING.get(workload)
    body: dict = {}
    if is_sharegpt(workload):
        # The sharegpt workloads of one load send the same conversations (paired
        # comparisons); each its own cache_salt, so a server shares no prefix-cache
        # block or n-gram corpus between them.
        body["cache_salt"] = workload
    if sampling is None:
        out = ["--temperature", str(args.temperature)]
    else:
        out = ["--temperature", str(sampling["temperature"]), "--top-p", str(sampling["top_p"])]
        if "seed" in sampling:   # not a vllm bench serve flag: the request body's "seed"
            body["seed"] = sampling["seed"]
    return out + (["--extra-body", json.dumps(body)] if body else [])


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


def write_dataset(path: Path) -> int:
    """The mixed prompt set as vLLM's ``custom`` dataset (JSONL, one "prompt" per line)."""
    prompts = load_prompt_set("mixed")
    write_prompts(path, prompts)
    return len(prompts)


def _dataset_args(workload: str, dataset: Path, args: argparse.Namespace, varied: bool) -> list[str]:
    if is_sharegpt(workload):
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

    varied: ``dataset`` gives each request its ``output_tokens`` (``workloads.output_lengths``).
    """
    backend, endpoint = WORKLOADS[workload]
    cmd = [str(BIN / "vllm"), "bench", "serve", "--backend", backend, "--endpoint", endpoint,
           "--base-url", f"http://127.0.0.1:{server.port}", "--model", server.name,
           "--tokenizer", tokenizer, *_dataset_args(workload, dataset, args, varied),
           "--num-prompts", str(num_prompts),
           *_sampling_args(workload, args), "--seed", str(args.seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--save-detailed",
           "--result-dir", str(result.parent), "--result-filename", result.name,
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
    cell.update(steady_ttft(cell, load))
    return cell


def after_start_burst(cell: dict, kind: str, value: float) -> list[int] | None:
    """Indices of a cell's requests in start order, without a closed loop's start burst
    (at concurrency c the first c, sent at once; a rate load keeps every request). None
    when vLLM's result lacks the per-request lists (``ttfts``, ``start_times``)."""
    ttfts, starts = cell.get("ttfts"), cell.get("start_times")
    if not ttfts or not starts or len(ttfts) != len(starts):
        return None
    order = sorted(range(len(ttfts)), key=lambda i: starts[i])
    return order[int(value) if kind == "max_concurrency" else 0:]


def steady_ttft(cell: dict, load: Load) -> dict:
    """TTFT p50 / p99 (ms) without a closed loop's start burst: at concurrency c the first
    c requests are sent at once and wait for each other's prefills, a start-up transient
    that is c / n of the cell's requests (a quarter at 4·c). Rate loads keep every request.
    Empty when vLLM's result lacks the per-request lists."""
    order = after_start_burst(cell, load.kind, load.value)
    if order is None:
        return {}
    ttfts = cell["ttfts"]
    kept = [ttfts[i] for i in order if ttfts[i] > 0] or ttfts
    # stats.quantile interpolates as numpy does, as vLLM's own percentiles
    return {"steady_p50_ttft_ms": 1000 * quantile(kept, 0.5),
            "steady_p99_ttft_ms": 1000 * quantile(kept, 0.99)}
