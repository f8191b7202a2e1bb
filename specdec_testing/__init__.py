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


def stop_process_group(proc: Any, sig: int, wait_s: float) -> None:
    """Stop a ``vllm serve`` started with ``start_new_session=True``: send ``sig`` to its
    process group (API server, engine core, workers), wait ``wait_s`` seconds, then
    SIGKILL the group. A process that already exited is left alone."""
    import os
    import signal
    import subprocess

    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
