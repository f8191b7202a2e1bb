"""From raw measurements to per-configuration results (no vLLM import).

A *run* is one ``generate`` call: one configuration, one workload, one temperature,
one repetition. Its baseline is the ``nospec`` run of the same engine group,
repetition, workload and temperature (measured minutes apart at most); every
ratio below is taken against that run.

Per run:
  tps                  output tokens / wall seconds of the generate call
  speedup              tps / tps(baseline)                                (paired)
  alpha_vllm           accepted / draft tokens (vLLM counters, deltas over the run)
  mean_accepted_len    1 + accepted / drafts; drafts = rounds with >= 1 draft token
  accept_by_pos[i]     accepted at position i / drafts (unconditional)
  alpha_eff            the alpha of the i.i.d. model whose E[N] = mean_accepted_len
  t_target             baseline seconds per decode step at the workload's batch size
                       (model-runner time except drafting; StepTimers buckets)
  t_draft              this run's drafting seconds per decode step / k
  c_prime              t_draft / t_target
  c_prime_fwd          plugin only: (draft_seconds / draft_forwards) / t_target
  verify_ratio         this run's non-drafting seconds per decode step / t_target
  bound                E[N] / (1 + k c'), E[N] = mean_accepted_len
  efficiency           speedup / bound
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict

from benchmarks import analytic
from benchmarks.stats import paired_ratios, summarize

SPEC_KEYS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_pos",
}
PROPOSER_KEYS = ("draft_seconds", "draft_forwards", "rounds", "drafted", "accepted", "prefill_tokens")


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) else 0.0


def counter_delta(before: dict | None, after: dict | None) -> dict:
    """Deltas of vLLM's cumulative spec-decode counters (lists elementwise)."""
    before, after = before or {}, after or {}
    out: dict = {}
    for key, name in SPEC_KEYS.items():
        a, b = after.get(key), before.get(key)
        if isinstance(a, list):
            b = b if isinstance(b, list) else []
            out[name] = [_num(x) - (_num(b[i]) if i < len(b) else 0.0) for i, x in enumerate(a)]
        elif a is not None:
            out[name] = _num(a) - _num(b)
    return out


def proposer_delta(before: dict | None, after: dict | None) -> dict | None:
    if not after:
        return None
    before = before or {}
    return {k: _num(after.get(k)) - _num(before.get(k)) for k in PROPOSER_KEYS}


def outputs_digest(outputs: list[list[int]]) -> str:
    return hashlib.sha256(repr(outputs).encode()).hexdigest()[:16]


def _decode_buckets(timers: dict | None, batch: int) -> tuple[int, float, float]:
    """(steps, target_s, propose_s) over decode steps with ``batch`` requests, or over
    all decode steps if none had exactly that many."""
    if not timers:
        return 0, 0.0, 0.0
    dec = {int(k.split(":")[1]): v for k, v in timers.items() if k.startswith("decode:")}
    pick = [dec[batch]] if batch in dec else list(dec.values())
    return (sum(b["steps"] for b in pick), sum(b["target_s"] for b in pick),
            sum(b["propose_s"] for b in pick))


def request_steps(timers: dict | None) -> int:
    """Sum over steps of requests scheduled (prefill steps included)."""
    if not timers:
        return 0
    return sum(int(k.split(":")[1]) * v["steps"] for k, v in timers.items())


def derive_run(run: dict, base: dict | None, k: int, batch: int) -> dict:
    """Add the per-run quantities of the module docstring to ``run`` (in place)."""
    d: dict = {}
    spec = run.get("spec") or {}
    drafts, draft_tokens = spec.get("drafts", 0.0), spec.get("draft_tokens", 0.0)
    acc = spec.get("accepted", 0.0)
    if k and drafts > 0:
        d["alpha_vllm"] = acc / draft_tokens if draft_tokens else 0.0
        d["mean_accepted_len"] = 1.0 + acc / drafts
        d["accept_by_pos"] = [x / drafts for x in spec.get("accepted_per_pos", [])][:k]
        d["alpha_eff"] = analytic.alpha_from_mean_accepted_length(d["mean_accepted_len"], k)
    rs = request_steps(run.get("timers"))
    if rs:
        d["tokens_per_request_step"] = run["output_tokens"] / rs
    steps, target_s, propose_s = _decode_buckets(run.get("timers"), batch)
    if steps:
        d["step_s"] = target_s / steps
        if k:
            d["t_draft"] = propose_s / steps / k
    if base is not None:
        d["speedup"] = paired_ratios([run["tps"]], [base["tps"]])[0]
        b_steps, b_target, _ = _decode_buckets(base.get("timers"), batch)
        if b_steps:
            t_target = b_target / b_steps
            d["t_target"] = t_target
            if k and "t_draft" in d:
                d["c_prime"] = d["t_draft"] / t_target
            if k and "step_s" in d:
                d["verify_ratio"] = d["step_s"] / t_target
            prop = run.get("proposer")
            if k and prop and prop.get("draft_forwards"):
                d["c_prime_fwd"] = prop["draft_seconds"] / prop["draft_forwards"] / t_target
        if k and "mean_accepted_len" in d and "c_prime" in d:
            d["bound"] = d["mean_accepted_len"] / (1.0 + k * d["c_prime"])
            d["efficiency"] = analytic.efficiency(d["speedup"], d["bound"])
        if run.get("temperature") == 0 and run.get("outputs") and base.get("outputs"):
            d["greedy_identical"] = sum(a == b for a, b in zip(run["outputs"], base["outputs"]))
            d["greedy_requests"] = len(base["outputs"])
    run["derived"] = d
    return run


def baseline_key(run: dict) -> tuple:
    return (run["group"], run["rep"], run["workload"], run["temperature"])


def derive_all(runs: list[dict], configs: dict[str, dict], workloads: dict[str, dict]) -> None:
    bases = {baseline_key(r): r for r in runs if configs[r["config"]]["is_baseline"]}
    for r in runs:
        base = bases.get(baseline_key(r))
        derive_run(r, base, configs[r["config"]]["k"], workloads[r["workload"]]["batch_size"])


def _med(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return summarize(vals)["median"] if vals else None


def summarize_cells(runs: list[dict], configs: dict[str, dict]) -> list[dict]:
    """One record per (config, workload, temperature): spreads over repetitions;
    acceptance pooled over repetitions (counter sums)."""
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        cells[(r["config"], r["workload"], r["temperature"])].append(r)
    out = []
    for (cfg, wl, temp), rs in cells.items():
        k = configs[cfg]["k"]
        rs = sorted(rs, key=lambda r: (r["group"], r["rep"]))
        dv = [r["derived"] for r in rs]
        rec: dict = {"config": cfg, "workload": wl, "temperature": temp, "k": k,
                     "method": configs[cfg]["method"], "family": configs[cfg]["family"],
                     "reps": len(rs), "contended_runs": sum(bool(r.get("contended")) for r in rs),
                     "tps": summarize([r["tps"] for r in rs])}
        sp = [d["speedup"] for d in dv if "speedup" in d]
        if sp:
            rec["speedup"] = summarize(sp)
            rec["speedup"]["wins"] = sum(x > 1.0 for x in sp)
            rec["speedup_per_rep"] = sp
        if k:
            tot = defaultdict(float)
            pos = [0.0] * k
            for r in rs:
                s = r.get("spec") or {}
                for name in ("drafts", "draft_tokens", "accepted"):
                    tot[name] += s.get(name, 0.0)
                for i, x in enumerate(s.get("accepted_per_pos", [])[:k]):
                    pos[i] += x
            if tot["drafts"] > 0:
                rec["alpha_vllm"] = tot["accepted"] / tot["draft_tokens"] if tot["draft_tokens"] else 0.0
                rec["mean_accepted_len"] = 1.0 + tot["accepted"] / tot["drafts"]
                rec["accept_by_pos"] = [x / tot["drafts"] for x in pos]
                rec["alpha_eff"] = analytic.alpha_from_mean_accepted_length(rec["mean_accepted_len"], k)
                rec["expected_tokens_iid"] = analytic.expected_tokens_per_round(rec["alpha_eff"], k)
        for key in ("t_target", "t_draft", "step_s", "c_prime", "c_prime_fwd", "verify_ratio",
                    "bound", "efficiency", "tokens_per_request_step"):
            vals = [d[key] for d in dv if key in d]
            if vals:
                rec[key] = _med(vals)
                if key in ("c_prime", "bound", "efficiency"):
                    rec[key + "_range"] = [min(vals), max(vals)]
        gi = [d for d in dv if "greedy_identical" in d]
        if gi:
            rec["greedy_identical"] = [sum(d["greedy_identical"] for d in gi),
                                       sum(d["greedy_requests"] for d in gi)]
        out.append(rec)
    return out
