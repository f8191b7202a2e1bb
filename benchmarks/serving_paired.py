"""The serving report's per-request table: each request's TPOT and TTFT over no
speculation's for the same request, in the same repetition.

The product promises that every request is at least as fast as without speculation.
Percentiles of two configurations compare different requests: a median TPOT can hold
while a quarter of the requests slow down by 20 % and others speed up. With a fixed seed
`vllm bench serve` sends the same prompts in the same order to every server, and greedy
output is exact, so request i of a cell and request i of no speculation's cell are the
same prompt with the same answer length: their ratio is what speculation did to that
request (and to when it ran beside which others). Pairs are used only where the input and
output lengths match request by request.

The A/A control (`nospec-again`) runs the same schedule as no speculation, so its row is a
floor on the noise, not all of it: a configuration that changes step times also changes
which requests share a step.

Under closed-loop load that includes the prompts: a server that answers sooner is sent the
next prompts sooner, and a request may decode beside more prompt steps, whatever
speculation did to its own steps. ``prompt_density`` counts them (the last column), which
tells a TPOT ratio that the loop brought from one the steps made.
"""

from __future__ import annotations

import numpy as np

from benchmarks.configs import A_A, BASELINE
from benchmarks.serving_cells import by_load, load_label
from benchmarks.serving_tail import request_ms

SLOWER = (1.02, 1.10, 1.20)  # the shares reported: TPOT over no speculation's by more than these


def paired_ratios(cell: dict, base: dict, metric: str) -> np.ndarray | None:
    """Per-request ``metric`` ("tpot", "ttft", "e2e") of ``cell`` over ``base``'s for the
    same request; None when the two cells did not send and answer the same requests
    (input or output lengths differ, e.g. sampled output)."""
    if (cell.get("input_lens") != base.get("input_lens")
            or cell.get("output_lens") != base.get("output_lens") or not cell.get("latencies")):
        return None
    return request_ms(cell, metric) / request_ms(base, metric)


def prompt_density(cell: dict) -> tuple[int, int]:
    """(prompts, decode tokens): how many other requests' first tokens (the end of their
    prompt step) fell inside each request's decode (its first token to its last), summed,
    and the decode tokens (output - 1) those requests emitted, summed. Their ratio is the
    prompt steps a decode token shared its time with."""
    start = np.asarray(cell.get("start_times") or [], dtype=float)
    if len(start) != len(cell.get("latencies") or []) or not len(start):
        return 0, 0
    first = start + np.asarray(cell["ttfts"], dtype=float)
    end = start + np.asarray(cell["latencies"], dtype=float)
    out = np.asarray(cell["output_lens"], dtype=float)
    inside = (first[None, :] > first[:, None]) & (first[None, :] < end[:, None])
    keep = out > 1
    return int(inside[keep].sum()), int((out[keep] - 1).sum())


def paired_lines(res: dict) -> list[str]:
    """Markdown: per load and configuration, over all repetitions' requests, the median
    per-request TPOT and TTFT ratio to no speculation, the shares of requests whose TPOT
    is more than each of SLOWER times no speculation's, and the worst one. [] when no
    cells pair."""
    groups = by_load(res["cells"])
    rows = []
    for (workload, kind, load), by_config in sorted(groups.items()):
        base = by_config.get(BASELINE, {})
        for config in sorted(k for k in by_config if k != BASELINE):
            tpot, ttft, unpaired = [], [], 0
            dens = np.zeros(4)  # prompts, tokens: this config's, then no speculation's
            for rep, cell in sorted(by_config[config].items()):
                t = paired_ratios(cell, base[rep], "tpot") if rep in base else None
                if t is None:
                    unpaired += 1
                    continue
                tpot.append(t)
                ttft.append(paired_ratios(cell, base[rep], "ttft"))
                dens += prompt_density(cell) + prompt_density(base[rep])
            if not tpot:
                continue
            t, f = np.concatenate(tpot), np.concatenate(ttft)
            shares = " | ".join(f"{np.mean(t > s):.0%}" for s in SLOWER)
            note = f" ({unpaired} unpaired)" if unpaired else ""
            loop = (f"{dens[0] / dens[1] / (dens[2] / dens[3]):.2f}x"
                    if dens[1] and dens[2] and dens[3] else "-")
            rows.append(f"| {workload} | {load_label(kind, load)} | {config} | {len(tpot)}{note} | "
                        f"{len(t)} | {np.median(t):.2f}x | {shares} | {t.max():.2f}x | "
                        f"{np.median(f):.2f}x | {loop} |")
    if not rows:
        return []
    return ["## Each request against itself without speculation", "",
            "Request i of a cell and of no speculation's cell in the same repetition are the "
            "same prompt with the same answer (fixed seed, exact output): the ratios are per "
            "request, pooled over repetitions. Columns: the median request's TPOT ratio, the "
            "share of requests whose TPOT is more than 1.02x / 1.10x / 1.20x no speculation's, "
            "the worst, the median TTFT ratio, and the prompts per decode token over no "
            "speculation's (`prompt_density`: other requests' prompt steps that ended while a "
            "request decoded, pooled: in a closed loop a faster server is sent prompts sooner, "
            "and decoding requests share steps with them). "
            f"The A/A control (`{A_A}`) runs no speculation's very schedule, so its row is a "
            "floor on the noise: a configuration that changes step times also changes which "
            "requests share a step.", "",
            "| workload | load | config | reps | requests | TPOT ratio p50 | "
            + " | ".join(f"TPOT > {s:.2f}x" for s in SLOWER) + " | worst | TTFT ratio p50 |"
            " prompts / decode token |",
            "|---|---|---|---:|---:|---:|" + "---:|" * len(SLOWER) + "---:|---:|---:|"] + rows + [""]
