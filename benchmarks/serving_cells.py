"""What identifies a serving benchmark cell's load, and how its time splits, shared by
the report, its plots, the merge of runs and the throughput ceiling."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

LOAD_KINDS = (("max_concurrency", "concurrency"), ("request_rate", "request rate (req/s)"))


def load_of(cell: dict) -> tuple[str, float]:
    """(load kind, value) of one cell: ("max_concurrency", 16) or ("request_rate", 2.0)."""
    kind = next(k for k, _ in LOAD_KINDS if k in cell)
    return kind, cell[kind]


def by_load(cells: Iterable[dict]) -> dict:
    """(workload, load kind, value) -> config -> repetition -> cell."""
    groups: dict = defaultdict(lambda: defaultdict(dict))
    for c in cells:
        groups[(c["workload"], *load_of(c))][c["config"]][c["repetition"]] = c
    return groups


def load_label(kind: str, value: float) -> str:
    """"c = 16" or "2 req/s"."""
    return f"c = {value:g}" if kind == "max_concurrency" else f"{value:g} req/s"


def time_split(cell: dict) -> tuple[float, float, float]:
    """(decode s, draft s, rest s) of a plugin cell, from its step counters: seconds in
    prefill-free target steps, in draft rounds, and the rest of the cell (steps that
    carried a prompt, scheduling, HTTP)."""
    sp = cell.get("spec") or {}
    decode_s = sp.get("verify_step_s", 0.0) + sp.get("plain_step_s", 0.0)
    draft_s = sp.get("draft_s", 0.0)
    return decode_s, draft_s, cell["duration"] - decode_s - draft_s
