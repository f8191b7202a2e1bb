"""The serving benchmark's report: ``serving.md`` and plots from ``serving.json``.

Per workload and load kind (fixed concurrency, Poisson rate): each configuration's
output throughput and median / p99 TPOT against load, its ratio to no speculation
(paired per repetition, median over repetitions), and the crossover: the lowest load
from which the configuration no longer beats no speculation on throughput.

At concurrency 1, the analytic bound per speculative configuration from what the same
cell measured: α = accepted / draft tokens and E[N] = 1 + accepted / drafts (vLLM's
counters), k̄ = draft tokens / drafts, c' = draft seconds per drafted token (the
plugin's draft-step histogram; in-tree methods export none) over no speculation's
median TPOT in the same repetition, S = E[N] / (1 + k̄·c'), and the measured TPOT
speedup over S (efficiency).

``python -m benchmarks.serving_report --merge RUN_DIR ... --out DIR`` writes one report
over several runs of the same pair and settings whose loads do not overlap (a sweep
measured in parts; ``serving_merge``): ratios stay paired inside each run.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from benchmarks.configs import A_A, BASELINE
from benchmarks.serving_cells import (LOAD_KINDS, SLOWED_PLAIN, cell_key, load_label,
                                      load_of, slowed_cells, time_split)
from benchmarks.serving_first_token import arrival_lines, first_token_lines, steady_lines
from benchmarks.serving_paired import paired_lines
from benchmarks.serving_tail import tail_lines
from benchmarks.stats import geomean, median

METRICS = (("output_throughput", "output tok/s"), ("median_tpot_ms", "TPOT p50 (ms)"),
           ("p99_tpot_ms", "TPOT p99 (ms)"), ("median_ttft_ms", "TTFT p50 (ms)"),
           ("p99_ttft_ms", "TTFT p99 (ms)"), ("p99_e2el_ms", "end-to-end p99 (ms)"))
SHORT = ("tput", "TPOT p50", "TPOT p99", "TTFT p50", "TTFT p99", "e2e p99")
# Workloads whose prompts `vllm bench serve` cycles (benchmarks.serving): every table
# that shows them says so.
REPLAYED = {"mixed": "replay: 8 prompts cycled", "chat": "replay: 8 prompts cycled, as chat"}
# Sampled workloads: vLLM 0.32's own rejection sampler is not exact on CPU (compat/patches.py,
# the sampling rows), so in-tree methods' rows there do not sample the target's distribution.
SAMPLED = {"sharegpt-t07": "T 0.7, top-p 0.9; in-tree methods not exact on CPU",
           "sharegpt-t07-seeded": "T 0.7, top-p 0.9, seeded; in-tree methods not exact on CPU"}


def workload_label(name: str) -> str:
    """``name``, with "(replay: ...)" for a replayed workload and the sampling of a sampled one."""
    note = REPLAYED.get(name) or SAMPLED.get(name)
    return f"{name} ({note})" if note else name


def _table(res: dict) -> dict:
    """{(workload, kind): {load: {config: {metric: [value per repetition]}}}}"""
    t: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list))))
    for c in res["cells"]:
        kind, load = load_of(c)
        row = t[(c["workload"], kind)][load][c["config"]]
        for m, _ in METRICS:
            row[m].append(c.get(m))
        row["contended"].append(bool(c.get("contended")))
    return t


def _ratios(row: dict, base: dict, metric: str) -> list[float]:
    """Paired ratios row / base, one per repetition both measured."""
    return [a / b for a, b in zip(row[metric], base[metric]) if a is not None and b]


def _ratio(row: dict, base: dict, metric: str) -> float | None:
    rs = _ratios(row, base, metric)
    return median(rs) if rs else None


def pooled(res: dict) -> dict:
    """{(workload, kind, config): {metric: every paired ratio to no speculation over all
    loads and repetitions}} for throughput and median TPOT."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for (workload, kind), loads in _table(res).items():
        for row_by_cfg in loads.values():
            base = row_by_cfg.get(BASELINE)
            for cfg, row in row_by_cfg.items():
                if cfg == BASELINE or base is None:
                    continue
                for m, _ in METRICS[:2]:
                    out[(workload, kind, cfg)][m] += _ratios(row, base, m)
    return out


def pooled_lines(res: dict) -> list[str]:
    """Markdown: per workload, load kind and configuration, the geometric mean and range
    of its paired ratios over every load and repetition, next to the A/A control's."""
    pool = pooled(res)
    if not pool:
        return []
    aa = (f"`{A_A}` is a second engine without speculation: its spread is what this "
          "run's noise alone gives." if any(k[2] == A_A for k in pool) else
          f"This run has no A/A control (add `{A_A}` to `--configs`).")
    lines = ["## Pooled over loads and repetitions", "",
             "Geometric mean [min, max] of every paired ratio to no speculation. " + aa, "",
             "| workload | load kind | config | ratios | tput | TPOT p50 |",
             "|---|---|---|---:|---|---|"]
    for (workload, kind, cfg), by_m in sorted(pool.items()):
        cells = [f"{geomean(v):.3f}x [{min(v):.2f}, {max(v):.2f}]" if v else "–"
                 for v in (by_m["output_throughput"], by_m["median_tpot_ms"])]
        lines.append(f"| {workload_label(workload)} | {dict(LOAD_KINDS)[kind]} | {cfg} | "
                     f"{len(by_m['output_throughput'])} | " + " | ".join(cells) + " |")
    return lines + [""]


def crossovers(res: dict) -> dict:
    """{(workload, kind): {config: lowest load where its throughput ratio < 1, or None}}."""
    out = {}
    for key, loads in _table(res).items():
        found: dict = {}
        for load in sorted(loads):
            base = loads[load].get(BASELINE)
            for cfg, row in loads[load].items():
                if cfg == BASELINE or base is None or cfg in found:
                    continue
                r = _ratio(row, base, "output_throughput")
                if r is not None and r < 1.0:
                    found[cfg] = load
        configs = {c for load in loads.values() for c in load if c != BASELINE}
        out[key] = {c: found.get(c) for c in sorted(configs)}
    return out


def bound_rows(res: dict) -> list[dict]:
    """Concurrency-1 cells of speculative configs: α, E[N], k̄, c', S, TPOT speedup, per rep."""
    base = {(c["workload"], c["repetition"]): c.get("median_tpot_ms") for c in res["cells"]
            if c["config"] == BASELINE and c.get("max_concurrency") == 1}
    rows = []
    for c in res["cells"]:
        sp, t0 = c.get("spec"), base.get((c["workload"], c["repetition"]))
        if c["config"] in (BASELINE, A_A) or c.get("max_concurrency") != 1 or not sp or not t0:
            continue
        row = {"config": c["config"], "workload": c["workload"], "repetition": c["repetition"],
               "tpot_speedup": t0 / c["median_tpot_ms"] if c.get("median_tpot_ms") else None}
        if sp["drafts"] and sp["draft_tokens"]:
            k_bar = sp["draft_tokens"] / sp["drafts"]
            row.update(alpha=sp["accepted"] / sp["draft_tokens"], k_bar=k_bar,
                       e_n=1 + sp["accepted"] / sp["drafts"])
            if sp["draft_rounds"]:   # plugin only: one draft round per drafting step at c=1
                row["c_prime"] = sp["draft_s"] / sp["draft_tokens"] / (t0 / 1e3)
                row["bound"] = row["e_n"] / (1 + k_bar * row["c_prime"])
        rows.append(row)
    return rows


def cpu_lines(res: dict) -> list[str]:
    """Markdown: the server's CPU milliseconds per output token, by process (median
    over repetitions), per workload, load and configuration."""
    acc: dict = defaultdict(lambda: defaultdict(list))
    for c in res["cells"]:
        cpu, toks = c.get("server_cpu_s"), c.get("total_output_tokens")
        if not cpu or not toks:
            continue
        kind, load = load_of(c)
        for role, sec in cpu.items():
            acc[(c["workload"], kind, load, c["config"])][role].append(1e3 * sec / toks)
    if not acc:
        return []
    roles = ("worker", "engine", "api")
    lines = ["## Server CPU per output token (ms, median over repetitions)", "",
             "worker: the model runner's process (target, drafting, sampling); engine: "
             "EngineCore (scheduling; it waits for the worker by spinning); api: the "
             "HTTP server.", "",
             "| workload | load | config | " + " | ".join(roles) + " |",
             "|---|---|---|" + "---:|" * len(roles)]
    for (workload, kind, load, config), by_role in sorted(acc.items()):
        lines.append(f"| {workload} | {load_label(kind, load)} | {config} | " +
                     " | ".join(f"{median(by_role[r]):.3f}" if by_role.get(r) else "–"
                                for r in roles) + " |")
    return lines + [""]


def rep_lines(res: dict) -> list[str]:
    """Markdown: every cell's ratios to no speculation in the same repetition (the
    first-token and tail columns first), and the share of draft tokens the step plan cut
    (cut / (verified + cut); "–" where the server has no plan)."""
    base = {(c["workload"], *load_of(c), c["repetition"]): c
            for c in res["cells"] if c["config"] == BASELINE}
    order = ("median_ttft_ms", "p99_ttft_ms", "p99_e2el_ms", "output_throughput",
             "median_tpot_ms", "p99_tpot_ms")
    rows, slowed = [], slowed_cells(res["cells"])
    for c in res["cells"]:
        kind, load = load_of(c)
        b = base.get((c["workload"], kind, load, c["repetition"]))
        if b is None or c["config"] == BASELINE:
            continue
        ratio = [f"{c[m] / b[m]:.2f}" if c.get(m) is not None and b.get(m) else "–" for m in order]
        sp = c.get("spec") or {}
        cut, kept = sp.get("plan_cut"), sp.get("draft_tokens", 0)
        plugin = c["config"].startswith("plugin")  # in-tree servers export no plan counter
        share = f"{cut / (cut + kept):.2f}" if plugin and cut is not None and cut + kept else "–"
        flag = "*" if c.get("contended") or b.get("contended") else ""
        if cell_key(c) in slowed:
            flag += " slowed"
        rows.append(((c["workload"], kind, load, c["repetition"], c["config"]),
                     f"| {workload_label(c['workload'])} | {load_label(kind, load)} | "
                     f"{c['repetition']} | {c['config']}{flag} | " + " | ".join(ratio)
                     + f" | {share} |"))
    if not rows:
        return []
    return ["## Every repetition: ratios to no speculation", "",
            "Paired with no speculation's cell of the same repetition. cut share: draft "
            "tokens the step plan cut before verification / (verified + cut). slowed: "
            "the server's own plain steps ran slow in that cell (see the decode steps "
            "below).", "",
            "| workload | load | rep | config | TTFT p50 | TTFT p99 | e2e p99 | tput | "
            "TPOT p50 | TPOT p99 | cut share |", "|---|---|---:|---|" + "---:|" * 7] + \
        [r[1] for r in sorted(rows)] + [""]


def step_lines(res: dict) -> list[str]:
    """Markdown: the plugin's decode steps per cell, verifying vs plain (mean ms and
    tokens emitted per step), from its step counters; [] when no cell has them."""
    rows, slowed = [], slowed_cells(res["cells"])
    for c in res["cells"]:
        sp = c.get("spec") or {}
        if not sp.get("verify_steps") and not sp.get("plain_steps"):
            continue
        kind, load = load_of(c)
        part = []
        for k in ("verify", "plain"):
            n = sp.get(f"{k}_steps", 0)
            part += [f"{n:.0f}", f"{1e3 * sp[f'{k}_step_s'] / n:.1f}" if n else "–",
                     f"{sp[f'{k}_emitted'] / n:.2f}" if n else "–"]
        # rest: steps that carried a prompt, scheduling, HTTP; speculation can't shorten
        # most of it.
        decode_s, draft_s, rest = time_split(c)
        part += [f"{c['duration']:.1f}", f"{decode_s:.1f}", f"{draft_s:.1f}", f"{rest:.1f}"]
        flag = " slowed" if cell_key(c) in slowed else ""
        rows.append((c["workload"], kind, load, c["config"], c["repetition"],
                     f"| {c['workload']} | {load_label(kind, load)} | {c['config']} | "
                     f"{c['repetition']}{flag} | "
                     + " | ".join(part) + " |"))
    if not rows:
        return []
    return ["## Plugin decode steps: verifying vs plain", "",
            "Steps that ran no prefill, from the plugin's `specdec_target_step_seconds` and "
            "`specdec_emitted_tokens_total` (a step's time runs from its scheduler output "
            "to the drafting call: target forward and sampling). Seconds of the cell: "
            "all of it, in those steps, in draft rounds, and the rest (steps that carried "
            "a prompt, scheduling, HTTP). slowed: the cell's plain steps took over "
            f"{SLOWED_PLAIN}x another repetition's at about the same tokens a step (the "
            "target's forward ran slower; the cell does not measure speculation).", "",
            "| workload | load | config | rep | verify steps | ms | tokens/step | "
            "plain steps | ms | tokens/step | cell s | decode s | draft s | rest s |",
            "|---|---|---|---:|" + "---:|" * 10] + \
        [r[-1] for r in sorted(rows, key=lambda r: r[:5])] + [""]


def markdown(res: dict) -> str:
    meta = res["meta"]
    lines = [f"# Serving benchmark ({meta['pair']} pair, {meta['started']})", "",
             f"`vllm bench serve` against `vllm serve`; git {meta['git'].get('short')}; "
             f"args {meta['args']}", ""]
    for src in meta.get("sources", []):
        lines += [f"- from `{src['run']}` (git {src['git']}): {', '.join(src['loads'])}"]
    lines += [""] if meta.get("sources") else []
    lines += ["Ratios are to no speculation, paired per repetition, median over repetitions "
              "(throughput: higher is better; TPOT: lower is better); with more than one "
              "repetition, the throughput ratios' range follows in brackets. `*`: a repetition "
              "ran while other processes used > 0.25 CPUs.", ""]
    cross = crossovers(res)
    for (workload, kind), loads in sorted(_table(res).items()):
        configs = sorted({c for load in loads.values() for c in load if c != BASELINE})
        lines += [f"## {workload_label(workload)}, by {dict(LOAD_KINDS)[kind]}", "",
                  "| load | nospec tok/s | nospec TPOT p50 | " +
                  " | ".join(f"{c} {' / '.join(SHORT)}" for c in configs) + " |",
                  "|---|---|---|" + "---|" * len(configs)]
        for load in sorted(loads):
            base = loads[load].get(BASELINE)
            if base is None:
                continue
            cells = [f"{median([v for v in base['output_throughput'] if v is not None]):.1f}",
                     f"{median([v for v in base['median_tpot_ms'] if v is not None]):.1f}"]
            for c in configs:
                row = loads[load].get(c)
                if row is None:
                    cells.append("–")
                    continue
                rs = [_ratios(row, base, m) for m, _ in METRICS]
                flag = "*" if any(row["contended"]) or any(base["contended"]) else ""
                text = [f"{median(r):.2f}x" if r else "–" for r in rs]
                if len(rs[0]) > 1:   # throughput: its range over repetitions
                    text[0] += f" [{min(rs[0]):.2f}, {max(rs[0]):.2f}]"
                cells.append(" / ".join(text) + flag)
            lines.append(f"| {load:g} | " + " | ".join(cells) + " |")
        lines += ["", "Crossover (lowest load where throughput falls below no speculation): " +
                  ", ".join(f"{c}: {'never' if v is None else f'{v:g}'}"
                            for c, v in cross[(workload, kind)].items()), ""]
    lines += pooled_lines(res)
    lines += rep_lines(res)
    lines += tail_lines(res)
    lines += paired_lines(res)
    lines += cpu_lines(res)
    lines += step_lines(res)
    lines += steady_lines(res)
    lines += arrival_lines(res)
    lines += first_token_lines(res)
    rows = bound_rows(res)
    if rows:
        lines += ["## Analytic bound at concurrency 1", "",
                  "| workload | config | rep | α | E[N] | k̄ | c' | bound S | TPOT speedup | eff |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        f = lambda v, d=2: "–" if v is None else f"{v:.{d}f}"  # noqa: E731
        for r in sorted(rows, key=lambda r: (r["workload"], r["config"], r["repetition"])):
            eff = r["tpot_speedup"] / r["bound"] if r.get("bound") and r["tpot_speedup"] else None
            lines.append(f"| {workload_label(r['workload'])} | {r['config']} | {r['repetition']} | "
                         f"{f(r.get('alpha'))} | {f(r.get('e_n'))} | {f(r.get('k_bar'))} | "
                         f"{f(r.get('c_prime'), 3)} | {f(r.get('bound'))} | "
                         f"{f(r['tpot_speedup'])} | {f(eff)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def write_all(res: dict, out: Path) -> list[Path]:
    md = out / "serving.md"
    md.write_text(markdown(res))
    png = out / "serving.png"
    from benchmarks.serving_plot import plot  # matplotlib only here

    plot(res, png)
    return [md, png]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write serving.md and serving.png for merged runs.")
    ap.add_argument("--merge", nargs="+", type=Path, required=True, metavar="RUN_DIR")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    from benchmarks.serving_merge import merge  # it imports this module

    res = merge(a.merge)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "serving.json").write_text(json.dumps(res, indent=1))
    for path in write_all(res, a.out):
        print(path)


if __name__ == "__main__":
    main()
