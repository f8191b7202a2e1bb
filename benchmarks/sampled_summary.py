"""A sampled-chat run's summary: greedy, sampled and seeded rows of each configuration on
the same prompts (the ``sharegpt*`` workloads of one load share their conversations).

Per load and configuration, for each workload: throughput and TPOT p50 over no
speculation's in the same workload and repetition; acceptance (vLLM's counters: every
method) and, for the plugin, per draft source; the mean verifying and plain step (ms,
the plugin's step histogram: target forward and the exact sampler). Then the seeded
over the unseeded TPOT p50 of the same configuration (same prompts, other text)::

    python -m benchmarks.sampled_summary results/RUN/serving.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from benchmarks.configs import BASELINE
from benchmarks.serving_cells import load_label, load_of

WORKLOADS = ("sharegpt", "sharegpt-t07", "sharegpt-t07-seeded")
SOURCES = ("ngram", "draft")


def _rate(num: float, den: float) -> str:
    return f"{num / den:.2f}" if den else "-"


def _cell_line(cell: dict, base: dict) -> str:
    """ratio of throughput / TPOT p50, acceptance, per-source acceptance, step ms."""
    s = cell.get("spec") or {}
    tput = cell["output_throughput"] / base["output_throughput"]
    tpot = cell["median_tpot_ms"] / base["median_tpot_ms"]
    per_source = " ".join(f"{src} {_rate(s.get(f'accepted_{src}', 0), s.get(f'drafted_{src}', 0))}"
                          f" of {int(s.get(f'drafted_{src}', 0))}" for src in SOURCES
                          if f"drafted_{src}" in s)
    steps = " ".join(f"{kind} {1e3 * s[f'{kind}_step_s'] / s[f'{kind}_steps']:.1f} ms"
                     for kind in ("verify", "plain") if s.get(f"{kind}_steps"))
    return (f"{tput:.2f}x / {tpot:.2f}x, accepted {_rate(s.get('accepted', 0), s.get('draft_tokens', 0))}"
            f" of {int(s.get('draft_tokens', 0))}" + (f" ({per_source})" if per_source else "")
            + (f"; steps {steps}" if steps else ""))


def summary(res: dict) -> list[str]:
    cells = defaultdict(dict)  # (load, rep) -> (config, workload) -> cell
    for c in res["cells"]:
        if c["workload"] in WORKLOADS:
            cells[(load_of(c), c["repetition"])][(c["config"], c["workload"])] = c
    lines = []
    for (load, rep), got in sorted(cells.items()):
        lines.append(f"## {load_label(*load)}, repetition {rep}")
        lines.append("throughput / TPOT p50 over no speculation's in the same workload, acceptance")
        for config in sorted({k[0] for k in got} - {BASELINE}):
            for w in WORKLOADS:
                cell, base = got.get((config, w)), got.get((BASELINE, w))
                if cell and base:
                    lines.append(f"  {config:34s} {w:20s} {_cell_line(cell, base)}")
        lines.append("seeded over unseeded TPOT p50 (same prompts):")
        for config in sorted({k[0] for k in got}):
            a, b = got.get((config, "sharegpt-t07-seeded")), got.get((config, "sharegpt-t07"))
            if a and b:
                lines.append(f"  {config:34s} {a['median_tpot_ms'] / b['median_tpot_ms']:.3f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", type=Path, help="a serving run's serving.json")
    print("\n".join(summary(json.loads(ap.parse_args(argv).result.read_text()))))


if __name__ == "__main__":
    main()
