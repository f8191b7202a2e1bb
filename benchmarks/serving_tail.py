"""The serving report's tail table: p99 of TTFT, TPOT and end-to-end latency over every
repetition's requests pooled, as ratios to no speculation with a bootstrap interval.

A cell's p99 over 16-128 requests is its largest one or two requests: in one run the
A/A control's TPOT p99 ratio read 0.80x-1.28x per repetition
(results/2026-11-28-7bee9e0-serving-smol-sharegpt-c16-c32-f32-spread/). Pooling the
repetitions and resampling requests says how far a tail ratio can be read.
"""

from __future__ import annotations

import numpy as np

from benchmarks.configs import A_A, BASELINE
from benchmarks.serving_cells import by_load, load_label

Q = 99.0  # the percentile, as `vllm bench serve --metric-percentiles 50,99`
BOOT = 2000  # resamples per ratio
LEVEL = 0.90  # the interval's coverage: its 5th and 95th resampled percentiles
METRICS = (("ttft", "TTFT p99"), ("tpot", "TPOT p99"), ("e2e", "e2e p99"))


def request_ms(cell: dict, metric: str) -> np.ndarray:
    """Per-request values in ms: "ttft", "e2e", or "tpot" as vLLM defines it,
    (latency - TTFT) / (output tokens - 1) over requests of more than one token."""
    ttft = np.asarray(cell.get("ttfts") or [], dtype=float)
    lat = np.asarray(cell.get("latencies") or [], dtype=float)
    if metric == "ttft":
        return ttft * 1000.0
    if metric == "e2e":
        return lat * 1000.0
    out = np.asarray(cell.get("output_lens") or [], dtype=float)
    keep = out > 1
    return (lat[keep] - ttft[keep]) / (out[keep] - 1.0) * 1000.0


def pooled_ratio(samples: list[np.ndarray], base: list[np.ndarray],
                 rng: np.random.Generator) -> tuple[float, float, float]:
    """(ratio, low, high): the p99 of ``samples`` pooled over repetitions over that of
    ``base``, and the LEVEL interval of the ratio when each repetition's requests are
    resampled with replacement on both sides (repetitions stay strata)."""
    def boot(reps: list[np.ndarray]) -> np.ndarray:
        draws = [r[rng.integers(0, len(r), size=(BOOT, len(r)))] for r in reps]
        return np.percentile(np.concatenate(draws, axis=1), Q, axis=1)

    ratio = float(np.percentile(np.concatenate(samples), Q) / np.percentile(np.concatenate(base), Q))
    spread = boot(samples) / boot(base)
    tail = (1.0 - LEVEL) / 2.0
    lo, hi = np.quantile(spread, [tail, 1.0 - tail])
    return ratio, float(lo), float(hi)


def tail_lines(res: dict, seed: int = 0) -> list[str]:
    """Markdown: per load and configuration, the pooled p99 ratios of TTFT, TPOT and e2e
    latency to no speculation with their LEVEL interval and the requests pooled; the
    A/A control's row gives the noise. [] when cells carry no per-request lists."""
    groups = by_load(c for c in res["cells"] if c.get("latencies"))
    rng = np.random.default_rng(seed)
    rows = []
    for (workload, kind, load), by_config in sorted(groups.items()):
        base = by_config.get(BASELINE, {})
        for config in sorted(k for k in by_config if k != BASELINE):
            reps = sorted(set(by_config[config]) & set(base))
            if not reps:
                continue
            text = []
            for metric, _ in METRICS:
                xs = [request_ms(by_config[config][r], metric) for r in reps]
                bs = [request_ms(base[r], metric) for r in reps]
                if any(len(x) == 0 for x in xs + bs):
                    text.append("–")
                    continue
                ratio, lo, hi = pooled_ratio(xs, bs, rng)
                text.append(f"{ratio:.2f}x [{lo:.2f}, {hi:.2f}]")
            n = sum(len(by_config[config][r]["latencies"]) for r in reps)
            rows.append(f"| {workload} | {load_label(kind, load)} | {config} | {len(reps)} | {n} | "
                        + " | ".join(text) + " |")
    if not rows:
        return []
    return ["## The tail over every repetition's requests", "",
            f"p{Q:g} over the requests of all repetitions pooled, over no speculation's; in brackets "
            f"the {LEVEL:.0%} interval when each repetition's requests are resampled ({BOOT} "
            "resamples). A p99 of 32-256 requests is set by its largest one to three: "
            f"read each row against the A/A control's (`{A_A}`).", "",
            "| workload | load | config | reps | requests | " + " | ".join(h for _, h in METRICS) + " |",
            "|---|---|---|---:|---:|" + "---|" * len(METRICS)] + rows + [""]
