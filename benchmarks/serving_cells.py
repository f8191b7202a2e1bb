"""What identifies a serving benchmark cell's load, and how its time splits, shared by
the report, its plots, the merge of runs and the throughput ceiling."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

LOAD_KINDS = (("max_concurrency", "concurrency"), ("request_rate", "request rate (req/s)"))
# A plugin cell whose own plain steps ran this much slower than another repetition's
# (same config and load, about the same tokens a step) is flagged. Over the 121 such
# pairs of repetitions under results/ on 2026-11-29 the slower one read 1.04x at the
# median and 1.19x at the 90th percentile; five read 1.31-1.63x, among them the c = 8
# cell left out by hand (results/2026-11-29-75745e9-serving-smol-sharegpt-c4-c16-rates-f32-defaults/).
SLOWED_PLAIN = 1.3
SLOWED_MIN_STEPS = 20  # fewer plain steps (c = 1 verifies nearly every step) are too noisy to compare


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


def cell_key(cell: dict) -> tuple:
    """(workload, load kind, value, config, repetition): one cell of a run."""
    return (cell["workload"], *load_of(cell), cell["config"], cell["repetition"])


def slowed_cells(cells: Iterable[dict]) -> set[tuple]:
    """``cell_key``s of the plugin cells whose own plain decode steps took over
    SLOWED_PLAIN x the fastest other repetition's of the same config and load at about
    the same tokens a step (within 10 %; at least SLOWED_MIN_STEPS plain steps in both):
    the target's forward ran slower there, not the speculation, so the cell does not
    measure it."""
    out = set()
    for by_config in by_load(cells).values():
        for reps in by_config.values():
            plain = {}   # repetition -> (seconds, tokens emitted) per plain step
            for rep, c in reps.items():
                sp = c.get("spec") or {}
                if (n := sp.get("plain_steps", 0)) >= SLOWED_MIN_STEPS:
                    plain[rep] = (sp["plain_step_s"] / n, sp["plain_emitted"] / n)
            for rep, (sec, toks) in plain.items():
                others = [o_sec for r, (o_sec, o_toks) in plain.items()
                          if r != rep and abs(o_toks - toks) <= 0.1 * toks]
                if others and sec > SLOWED_PLAIN * min(others):
                    out.add(cell_key(reps[rep]))
    return out
