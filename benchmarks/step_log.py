"""Summarise the plugin's per-step DEBUG lines in ``vllm serve`` logs.

With the logger ``vllm.specdec_plugin.steps`` at DEBUG the plugin logs one ``specdec
step:`` line per target step (``step_record``) and one ``specdec round:`` line per
draft-model round. ``benchmarks/step_log.json`` is a vLLM logging config that does so;
every plugin server of a serving run then logs its steps to its ``serve-*.log``::

    VLLM_LOGGING_CONFIG_PATH=$PWD/benchmarks/step_log.json python -m benchmarks.serving ...
    python -m benchmarks.step_log results/RUN/serve-plugin-*-rep0.log [...]

Per log: the decode steps (no prompt tokens in the step) by kind, ``plain`` (verified
no drafts) and ``verify``: how many, their median rows, median measured ms (the target
step, the exact sampler included) and median host gap before the step (ms, the line's
``gap``: from the previous step's end to this one's scheduler output, that is planning,
scheduling and RPCs); then the share of all steps that carried a prompt.
"""

from __future__ import annotations

import argparse
import re
import statistics
from typing import Iterable

LINE = re.compile(r"specdec step: s (\S+) exact (\S+) gap (\S+) \| n (\d+) m (\d+) rows (\d+) "
                  r"verify (\d) emitted (\d+) \| pred (\S+) plain (\S+) sigma (\S+)")
KINDS = ("plain", "verify")


def parse(lines: Iterable[str]) -> list[dict]:
    """The ``specdec step:`` lines among ``lines``, in order: the measured ms (``s``,
    ``exact``, ``gap``), the tokens (``n`` decode/verify, ``m`` prompt), ``rows``,
    ``verify``, ``emitted``, and the fit's ms before the step (``pred``, ``plain``,
    ``sigma``; None where unfitted)."""
    out = []
    for line in lines:
        hit = LINE.search(line)
        if hit:
            s, exact, gap, n, m, rows, verify, emitted, pred, plain, sigma = hit.groups()
            ms = lambda x: None if x == "-" else float(x)  # noqa: E731
            out.append({"s": float(s), "exact": float(exact), "gap": float(gap), "n": int(n),
                        "m": int(m), "rows": int(rows), "verify": verify == "1",
                        "emitted": int(emitted), "pred": ms(pred), "plain": ms(plain),
                        "sigma": ms(sigma)})
    return out


def summary(steps: list[dict]) -> dict:
    """{"plain": ..., "verify": ...} over the decode steps (each: count, median rows, ms
    and gap; None for the medians of a kind without steps), and ``prompt_share``: the
    share of all steps that carried prompt tokens (None without steps)."""
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    out: dict = {}
    for kind in KINDS:
        rows = [r for r in steps if not r["m"] and r["verify"] == (kind == "verify")]
        out[kind] = {"count": len(rows), "rows": med([r["rows"] for r in rows]),
                     "ms": med([r["s"] for r in rows]), "gap_ms": med([r["gap"] for r in rows])}
    out["prompt_share"] = sum(1 for r in steps if r["m"]) / len(steps) if steps else None
    return out


# Batch sizes reported apart: a closed loop at c runs most of its steps at c rows or
# just under (c = 1, 8, 16 in this project's runs).
BUCKETS = ((1, 1), (2, 8), (9, 16), (17, 10**9))


def report(name: str, steps: list[dict]) -> list[str]:
    """The lines ``main`` prints for one log: all its steps, then by rows (``BUCKETS``)."""
    s = summary(steps)
    num = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    lines = [f"{name}: {len(steps)} steps, {num(s['prompt_share'], '.1%')} with a prompt"]
    for label, part in [("all", steps)] + [
            (f"rows {lo}-{hi}" if hi < 10**9 else f"rows >= {lo}",
             [r for r in steps if lo <= r["rows"] <= hi]) for lo, hi in BUCKETS]:
        k = summary(part)
        if not part:
            continue
        for kind in KINDS:
            lines.append(f"  {label:11s} {kind:6s} decode steps {k[kind]['count']:6d}, median rows "
                         f"{num(k[kind]['rows'], 'g')}, {num(k[kind]['ms'], '.2f')} ms, gap "
                         f"{num(k[kind]['gap_ms'], '.2f')} ms")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="server logs with the plugin's DEBUG step lines")
    for path in ap.parse_args(argv).logs:
        with open(path, errors="replace") as f:
            print("\n".join(report(path, parse(f))))


if __name__ == "__main__":
    main()
