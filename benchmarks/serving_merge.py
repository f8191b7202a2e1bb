"""Several serving runs as one result: a sweep measured in parts.

``merge`` joins the cells of runs made with the same pair and settings on the same
machine, each (workload, load) from one run only, so every ratio stays paired inside
its own run. The CLI is ``python -m benchmarks.serving_report --merge RUN_DIR ...``.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.serving_cells import load_label, load_of

# Settings that must agree for cells of different runs to share one table.
MERGE_SAME = ("pair", "output_len", "output_spread", "temperature", "dtype", "max_model_len",
              "eager", "num_prompts")


def _load_names(cells: list[dict]) -> list[str]:
    """["mixed c = 4", "chat 2 req/s", ...] in first-seen order."""
    return list(dict.fromkeys(f"{c['workload']} {load_label(*load_of(c))}" for c in cells))


def _host(meta: dict) -> tuple:
    m = meta.get("machine") or {}
    return m.get("hostname"), m.get("cpu_model"), m.get("logical_cpus"), m.get("gpu")


def merge(runs: list[Path]) -> dict:
    """One result from several serving.json runs (a sweep measured in parts). Each run's
    cells keep their pairing (by repetition, inside the run); a (workload, load) measured
    by two runs, or runs with different settings, raise SystemExit naming the cause."""
    results = []
    for run in runs:
        f = run / "serving.json"
        if not f.exists():
            raise SystemExit(f"{f} does not exist: pass run directories written by "
                             "`python -m benchmarks.serving`")
        results.append(json.loads(f.read_text()))
    first = results[0]["meta"]["args"]
    host = _host(results[0]["meta"])
    for run, res in zip(runs[1:], results[1:]):
        differ = [k for k in MERGE_SAME if res["meta"]["args"].get(k) != first.get(k)]
        differ += ["machine"] if _host(res["meta"]) != host else []
        if differ:
            raise SystemExit(f"{run} was run with other settings than {runs[0]} "
                             f"({', '.join(differ)}): merge only runs of one sweep")
    seen: dict = {}
    cells, sources = [], []
    for run, res in zip(runs, results):
        names = _load_names(res["cells"])
        for name in names:
            if name in seen:
                raise SystemExit(f"{name} was measured by both {seen[name]} and {run}: "
                                 "leave one of the runs out")
            seen[name] = run
        cells += [dict(c, run=run.name) for c in res["cells"]]
        sources.append({"run": run.name, "git": res["meta"]["git"].get("short"),
                        "started": res["meta"]["started"], "loads": names})
    metas = [r["meta"] for r in results]
    meta = {"pair": first["pair"], "started": min(m["started"] for m in metas),
            "finished": max(m.get("finished") or m["started"] for m in metas),
            "git": {"short": "+".join(dict.fromkeys(s["git"] for s in sources))},
            "args": {k: first.get(k) for k in MERGE_SAME}, "machine": metas[0].get("machine"),
            "sources": sources}
    return {"meta": meta, "cells": cells}
