"""How much faster the plugin's controller could make a closed-loop cell with the drafts
it had, without delaying first tokens by more than a budget: a ceiling from what the
cell measured.

A cell's time splits (``serving_report.step_lines``) into prefill-free decode steps,
draft rounds, and the rest: steps that carried a prompt, scheduling and HTTP. The
first-token bound (TTFT p50 <= 1.10x) caps how much verification may lengthen the
rest, since a prompt's first token comes at the end of its step. Generous to the
controller, the ceiling assumes:

- every token of the decode steps comes at the cost per token of the cell's
  verifying steps (none is decoded plainly), and draft rounds cost nothing;
- the rest grows by ``budget`` of its time, all of it verify tokens (at the fitted
  marginal cost b of a token) beside the prompts, each accepted at the cell's
  measured acceptance; each accepted one is a token the decode steps no longer emit.

It is not a bound on any proposer: better drafts (more tokens per verifying step)
move it. ``python -m benchmarks.throughput_ceiling RUN_DIR [--over suffix-k32]``
prints, per plugin cell, the measured and ceiling throughput over no speculation's
beside 1.1x the other configuration's.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from benchmarks.configs import BASELINE
from benchmarks.serving_cells import load_label, load_of, time_split

TTFT_BUDGET = 0.10  # the TTFT p50 bound, 1.10x: the most the rest may grow
FIT = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) .*step cost fit: a ([\d.]+) ms \+ "
                 r"b ([\d.]+) ms/token .* at B (\d+):")


def ceiling_s(rest_s: float, decode_tokens: float, verify_ms_per_token: float,
              b_ms: float, alpha: float, budget: float = TTFT_BUDGET) -> float:
    """Seconds the cell would take at the ceiling: the rest grown by ``budget`` (verify
    tokens beside prompts, ``alpha`` of them accepted) plus the decode steps' remaining
    tokens (``decode_tokens``: emitted in prefill-free steps) at the verifying steps'
    ms per token."""
    extra_s = budget * rest_s
    gained = alpha * extra_s / (b_ms / 1e3)
    return rest_s + extra_s + max(0.0, decode_tokens - gained) * verify_ms_per_token / 1e3


def fits(log: Path) -> list[tuple[str, float, float, int]]:
    """(time "MM-DD hh:mm:ss", a ms, b ms/token, rows) of each step-cost fit the server
    logged (vLLM's log lines carry no year: times compare as text within one)."""
    return [(m[1], float(m[2]), float(m[3]), int(m[4]))
            for m in FIT.finditer(log.read_text(errors="replace"))]


def fit_for(cell: dict, logged: list) -> float | None:
    """b (ms/token) of the last fit logged before the cell ended (its ``date``) with at
    least a quarter of its concurrency's rows."""
    d = cell["date"]  # "YYYYMMDD-hhmmss", when vllm bench serve finished the cell
    end = f"{d[4:6]}-{d[6:8]} {d[9:11]}:{d[11:13]}:{d[13:15]}"
    kind, load = load_of(cell)
    rows_min = load / 4 if kind == "max_concurrency" else 1
    before = [f for f in logged if f[0] <= end and f[3] >= rows_min and f[2] > 0]
    return before[-1][2] if before else None


def rows_of(run: Path, over: str) -> list[dict]:
    """One dict per plugin cell: its throughput over no speculation's, measured and at
    the ceiling, and ``over``'s in the same repetition."""
    res = json.loads((run / "serving.json").read_text())
    by = {(c["config"], c["workload"], *load_of(c), c.get("repetition")): c for c in res["cells"]}
    logged: dict[Path, list] = {}  # each server log parsed once (it serves every load)
    out = []
    for c in res["cells"]:
        sp = c.get("spec") or {}
        if not sp.get("verify_emitted") or not sp.get("draft_tokens"):
            continue
        key = (c["workload"], *load_of(c), c.get("repetition"))
        base, other = by.get((BASELINE, *key)), by.get((over, *key))
        log = run / f"serve-{c['config']}-rep{c.get('repetition')}.log"
        if log.exists() and log not in logged:
            logged[log] = fits(log)
        b = fit_for(c, logged[log]) if log in logged else None
        if base is None or b is None:
            continue
        cell = {"rest_s": time_split(c)[2],
                "decode_tokens": sp["verify_emitted"] + sp.get("plain_emitted", 0.0),
                "verify_ms_per_token": 1e3 * sp["verify_step_s"] / sp["verify_emitted"],
                "b_ms": b, "alpha": sp["accepted"] / sp["draft_tokens"]}
        nospec_s = c["total_output_tokens"] / base["output_throughput"]
        out.append({"cell": c, **cell,
                    "plain_ms_per_token": (1e3 * sp["plain_step_s"] / sp["plain_emitted"]
                                           if sp.get("plain_emitted") else None),
                    "measured": c["output_throughput"] / base["output_throughput"],
                    "ceiling": nospec_s / ceiling_s(**cell),
                    "other": (other["output_throughput"] / base["output_throughput"]
                              if other else None)})
    return out


def lines(run: Path, over: str) -> list[str]:
    """Markdown table of ``rows_of``."""
    f = lambda v, s=".2f": "–" if v is None else format(v, s)  # noqa: E731
    out = [f"| load | config | rep | verify ms/token | plain ms/token | b ms | α | plugin | ceiling | "
           f"{over} | 1.1x {over} |", "|---|---|---:|" + "---:|" * 8]
    for r in sorted(rows_of(run, over), key=lambda r: (load_of(r["cell"]), r["cell"]["config"],
                                                     r["cell"]["repetition"])):
        c, other = r["cell"], r["other"]
        out.append(f"| {load_label(*load_of(c))} | {c['config']} | {c['repetition']} | "
                   f"{r['verify_ms_per_token']:.2f} | {f(r['plain_ms_per_token'])} | "
                   f"{r['b_ms']:.2f} | {r['alpha']:.2f} | {r['measured']:.2f}x | "
                   f"{r['ceiling']:.2f}x | {f(other)}x | {f(other and 1.1 * other)}x |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a serving run's folder (serving.json, server logs)")
    ap.add_argument("--over", default="suffix-k32", help="the configuration to be 1.1x ahead of")
    args = ap.parse_args(argv)
    print("\n".join(lines(args.run, args.over)))


if __name__ == "__main__":
    main()
