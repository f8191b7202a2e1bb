"""Where each configuration's cell time goes, split by the kind of step, beside no
speculation's: steps that carried a prompt, decode steps that verified drafts, and
plain decode steps (each with its engine loop and post_step), in seconds summed over
the cell's busy stretch; and the output tokens of the cell.

A method's throughput over no speculation's is the ratio of the sums (the same output
tokens). The prompt-step column bounds what a method can gain while its prompt steps
take no longer (which the first-token bound asks): all of its gain must come from
the decode steps. A second table gives, under closed-loop load, the decode steps that
ran the full batch (every client's request decoding): how many, their scheduled tokens
and drafts per step, and their ms per step (loop, step and post_step), whose product
against no speculation's is what verification gained or lost there.

    python experiments/engine_timeline/split.py results/RUN [--load "c = 8"]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]  # summarize; the repo root
from benchmarks.serving_cells import load_label, load_of  # noqa: E402
from summarize import read, stretches  # noqa: E402


def cell_load(cell: dict) -> tuple[str, float, str]:
    """(load kind, value, label) of a cell, as the serving report names them."""
    kind, value = load_of(cell)
    return kind, value, load_label(kind, value)


def serve_logs(run: str, parse: Callable[[str], Any]) -> Callable[[dict], Any]:
    """cell -> ``parse`` of its server's log (each log parsed once; None without one)."""
    cache: dict[str, Any] = {}

    def of(cell: dict) -> Any:
        path = os.path.join(run, f"serve-{cell['config']}-rep{cell['repetition']}.log")
        if path not in cache:
            cache[path] = parse(path) if os.path.exists(path) else None
        return cache[path]
    return of


def split(eng: list[dict], start: float, end: float, batch: float | None) -> dict[str, float]:
    """Seconds in prompt / verify / plain steps whose start lies in [start, end]; and
    the decode steps of ``batch`` rows (count, tokens, drafts, seconds)."""
    out = {"prompt": 0.0, "verify": 0.0, "plain": 0.0, "steps": 0,
           "full": 0, "full_tok": 0, "full_spec": 0, "full_s": 0.0}
    for part in stretches(eng):
        part[0] = {**part[0], "loop": 0.0}
        for s in part:
            if not start <= s["t"] <= end:
                continue
            kind = "prompt" if s["new"] else "verify" if s["spec"] else "plain"
            seconds = (s["loop"] + s["step"] + s["post"]) / 1e3
            out[kind] += seconds
            out["steps"] += 1
            if kind != "prompt" and s["rows"] == batch:
                out["full"] += 1
                out["full_tok"] += s["tok"]
                out["full_spec"] += s["spec"]
                out["full_s"] += seconds
    return out


def main(run: str, only: str | None) -> None:
    cells = json.load(open(os.path.join(run, "serving.json")))["cells"]
    rows: dict[tuple[str, str], list[dict]] = {}
    logs = serve_logs(run, lambda path: read(path)[0])
    for c in cells:
        kind, value, load = cell_load(c)
        eng = logs(c)
        if eng is None or not c.get("start_times") or (only and load != only):
            continue
        t0 = min(c["start_times"])
        t1 = max(s + lat for s, lat in zip(c["start_times"], c["latencies"]))
        d = split(eng, t0, t1, value if kind == "max_concurrency" else None)
        d["tokens"] = sum(c["output_lens"])
        d["rep"] = c["repetition"]
        rows.setdefault((load, c["config"]), []).append(d)
    print("load config | s in prompt steps / verify steps / plain steps (median over reps) "
          "| output tokens")
    for (load, config), ds in sorted(rows.items()):
        med = lambda k: statistics.median(d[k] for d in ds)  # noqa: E731
        print(f"{load} {config} | {med('prompt'):.2f} / {med('verify'):.2f} / "
              f"{med('plain'):.2f} | {med('tokens'):.0f} ({len(ds)} reps)")
    print("\nload config | full-batch decode steps | tokens / drafts a step | ms a step "
          "(median over reps)")
    for (load, config), ds in sorted(rows.items()):
        ds = [d for d in ds if d["full"]]
        if not ds:
            continue
        med = lambda f: statistics.median(f(d) for d in ds)  # noqa: E731
        print(f"{load} {config} | {med(lambda d: d['full']):.0f} | "
              f"{med(lambda d: d['full_tok'] / d['full']):.1f} / "
              f"{med(lambda d: d['full_spec'] / d['full']):.1f} | "
              f"{med(lambda d: d['full_s'] / d['full'] * 1e3):.1f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    only = args[args.index("--load") + 1] if "--load" in args else None
    main(args[0], only)
