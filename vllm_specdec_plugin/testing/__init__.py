"""Helpers for tests and benchmarks that drive a real vLLM engine in a subprocess."""

from __future__ import annotations

from typing import Any


def metric_values(llm: Any, prefixes: tuple[str, ...] = ()) -> dict:
    """Name -> value (counters/gauges) or values (vectors) from ``LLM.get_metrics()``,
    keeping only names that start with one of ``prefixes`` (all when empty)."""
    out: dict = {}
    for m in llm.get_metrics():
        if prefixes and not m.name.startswith(prefixes):
            continue
        v = getattr(m, "value", None)
        out[m.name] = getattr(m, "values", None) if v is None else v
    return out
