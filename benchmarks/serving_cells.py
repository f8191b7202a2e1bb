"""What identifies a serving benchmark cell's load, shared by the report, its plots and
the merge of runs."""

from __future__ import annotations

LOAD_KINDS = (("max_concurrency", "concurrency"), ("request_rate", "request rate (req/s)"))


def load_of(cell: dict) -> tuple[str, float]:
    """(load kind, value) of one cell: ("max_concurrency", 16) or ("request_rate", 2.0)."""
    kind = next(k for k, _ in LOAD_KINDS if k in cell)
    return kind, cell[kind]


def load_label(kind: str, value: float) -> str:
    """"c = 16" or "2 req/s"."""
    return f"c = {value:g}" if kind == "max_concurrency" else f"{value:g} req/s"
