"""The serving report's first-token tables (``serving.md``), from ``serving.json`` cells:
TTFT without a closed loop's start burst, by what each request found on arrival, and
where the server spent it (queue, prefill, the rest).
"""

from __future__ import annotations

from collections import defaultdict

from benchmarks.configs import BASELINE
from benchmarks.serving_cells import load_label, load_of
from benchmarks.serving_client import after_start_burst
from benchmarks.stats import median

# TTFT without a closed loop's start burst (serving_client.steady_ttft), where cells have it.
STEADY = (("steady_p50_ttft_ms", "TTFT p50"), ("steady_p99_ttft_ms", "TTFT p99"))


def steady_lines(res: dict) -> list[str]:
    """Markdown: TTFT p50 / p99 without the start burst, ratios to no speculation paired
    per repetition (median) beside no speculation's ms; [] when no cell has them."""
    t: dict = defaultdict(lambda: defaultdict(list))
    for c in res["cells"]:
        if c.get("steady_p50_ttft_ms") is not None:
            for m, _ in STEADY:
                t[(c["workload"], *load_of(c))][(c["config"], m)].append(
                    (c.get("repetition"), c[m]))
    rows = []
    for (workload, kind, load), vals in sorted(t.items()):
        base = {m: dict(vals.get((BASELINE, m), [])) for m, _ in STEADY}
        if not base[STEADY[0][0]]:
            continue
        configs = sorted({c for c, _ in vals if c != BASELINE})
        for config in configs:
            text = []
            for m, _ in STEADY:
                rs = [v / base[m][rep] for rep, v in vals[(config, m)] if base[m].get(rep)]
                text.append(f"{median(rs):.2f}x" if rs else "–")
            rows.append(f"| {workload} | {load_label(kind, load)} | {config} | "
                        f"{median(list(base[STEADY[0][0]].values())):.0f} | "
                        f"{median(list(base[STEADY[1][0]].values())):.0f} | " + " | ".join(text) + " |")
    if not rows:
        return []
    return ["## First token without the start burst", "",
            "At concurrency c the first c requests are sent at once and wait for each other's "
            "prefills (c / n of a cell's requests). These exclude them (rate loads keep every "
            "request): no speculation's ms, then ratios paired per repetition (median).", "",
            "| workload | load | config | nospec p50 ms | nospec p99 ms | TTFT p50 | TTFT p99 |",
            "|---|---|---|---:|---:|---:|---:|"] + rows + [""]


def arrivals(cell: dict) -> dict | None:
    """What each request found when it arrived, from the client's per-request lists
    (after a closed loop's start burst; rate loads keep every request): arrivals per
    second, how many found another request still waiting for its first token ("busy"),
    and the median TTFT (ms) of those that did and of those that did not ("alone").
    None without the lists."""
    kept = after_start_burst(cell, *load_of(cell))
    if kept is None or len(kept) < 2:
        return None
    ttfts, starts = cell["ttfts"], cell["start_times"]
    alone, busy = [], []
    for i in kept:
        waiting = any(j != i and starts[j] <= starts[i] < starts[j] + ttfts[j]
                      for j in range(len(ttfts)))
        (busy if waiting else alone).append(1e3 * ttfts[i])
    span = starts[kept[-1]] - starts[kept[0]]
    return {"rate": (len(kept) - 1) / span if span > 0 else None, "n": len(kept),
            "busy": len(busy), "alone_ms": median(alone) if alone else None,
            "busy_ms": median(busy) if busy else None}


def arrival_lines(res: dict) -> list[str]:
    """Markdown: per cell, the arrival rate, the share of arrivals that found another
    request before its first token, and TTFT p50 of those that found none, beside no
    speculation's (median over repetitions; the ratio paired per repetition)."""
    t: dict = defaultdict(dict)
    for c in res["cells"]:
        a = arrivals(c)
        if a is not None:
            t[(c["workload"], *load_of(c))][(c["config"], c.get("repetition"))] = a
    rows = []
    med = lambda vals, spec: format(median(vals), spec) if vals else "–"  # noqa: E731
    for (workload, kind, load), cells in sorted(t.items()):
        base = {rep: a for (cfg, rep), a in cells.items() if cfg == BASELINE}
        for config in sorted({cfg for cfg, _ in cells}):
            mine = [(rep, a) for (cfg, rep), a in cells.items() if cfg == config]
            ratio = [a["alone_ms"] / base[rep]["alone_ms"] for rep, a in mine
                     if rep in base and a["alone_ms"] and base[rep]["alone_ms"]]
            pick = lambda key: [a[key] for _, a in mine if a[key] is not None]  # noqa: E731
            rows.append(
                f"| {workload} | {load_label(kind, load)} | {config} | {len(mine)} | "
                f"{med(pick('rate'), '.2f')} | "
                f"{sum(a['busy'] for _, a in mine)} / {sum(a['n'] for _, a in mine)} | "
                f"{med(pick('alone_ms'), '.0f')} | {med(pick('busy_ms'), '.0f')} | "
                f"{med(ratio, '.2f')}" + ("x |" if ratio else " |"))
    if not rows:
        return []
    return ["## First token by what the request found on arrival", "",
            "After a closed loop's start burst (rate loads: every request). In a closed loop a "
            "faster server gets the next request sooner, so more arrivals find another prompt "
            "still waiting for its first token and queue behind its prefill. busy: arrivals "
            "that found one (summed over repetitions); alone / busy ms: TTFT p50 of each group "
            "(median over repetitions); alone ratio: alone ms over no speculation's, paired "
            "per repetition (median).", "",
            "| workload | load | config | reps | arrivals/s | busy | alone ms | busy ms | "
            "alone ratio |", "|---|---|---|---:|---:|---:|---:|---:|---:|"] + rows + [""]


def first_token_lines(res: dict) -> list[str]:
    """Markdown: where the first token's time goes, from vLLM's request histograms
    (mean ms per cell, median over repetitions); [] when no cell has them."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for c in res["cells"]:
        ft = c.get("first_token") or {}
        if ft.get("queued") and ft.get("prefilled") and ft.get("first_tokens"):
            groups[(c["workload"], *load_of(c), c["config"])].append(c)
    if not groups:
        return []
    rows = []
    for (workload, kind, load, config), cells in sorted(groups.items()):
        mean = {s: [1e3 * c["first_token"][s] / c["first_token"][n] for c in cells]
                for s, n in (("queue_s", "queued"), ("prefill_s", "prefilled"),
                             ("ttft_s", "first_tokens"))}
        rest = [t - q - p for q, p, t in zip(mean["queue_s"], mean["prefill_s"], mean["ttft_s"])]
        client = [c["mean_ttft_ms"] for c in cells if c.get("mean_ttft_ms") is not None]
        rows.append(f"| {workload} | {load_label(kind, load)} | {config} | {len(cells)} | "
                    + " | ".join(f"{median(v):.0f}" for v in
                                 (mean["queue_s"], mean["prefill_s"], rest, mean["ttft_s"]))
                    + (f" | {median(client):.0f} |" if client else " | – |"))
    return ["## First token, server side", "",
            "Mean ms per cell, median over repetitions, from vLLM's request histograms: "
            "queue = `request_queue_time` (in the scheduler's waiting queue), prefill = "
            "`request_prefill_time` (first scheduled to first token), TTFT = "
            "`time_to_first_token` (the API server's arrival to first token), rest = TTFT - "
            "queue - prefill (mostly waiting for the running step to end before the engine "
            "takes the request in); client = `vllm bench serve`'s mean TTFT.", "",
            "| workload | load | config | reps | queue | prefill | rest | TTFT | client |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|"] + rows + [""]
