"""Summarise the plugin's per-step DEBUG lines (``step_record``'s ``specdec step:``)
from ``vllm serve`` logs: how far the step cost fit's prediction, made before each step
was observed, is from the measured target step, by step kind and by phase of the run.

    VLLM_LOGGING_CONFIG_PATH=experiments/step_log/logging.json vllm serve ...   # or the
    serving benchmark with that variable set: every plugin server logs its steps
    python experiments/step_log/summarize.py results/RUN/serve-plugin-*-rep0.log [...]

Per log: steps without prefill split into plain and verifying, each by thirds of the
log's steps (the first third shows the fit's transient after start-up and warm-up):
count, median rows and tokens, median measured ms (target step less the exact sampler),
median measured / predicted, the step in plain steps at its batch as the rows' ledger
books it (F = (predicted + σ) / predicted plain step, ``row_credit``) and as measured
(seconds with the exact sampler / predicted plain step), and the median host gap before
the step (ms); then the steps that carried a prompt: count, mean ms and their share of
the log's step seconds; then decode steps without a prompt by batch (``by_batch``): what
the verifying steps emitted per row and cost against the plain steps of the same batches,
and, per busy stretch between idle gaps (a benchmark cell), what they saved: the seconds
plain steps of the same batches would have taken for the same tokens, less what they
took (``saved``), over the stretch's step and gap seconds.
"""

from __future__ import annotations

import re
import statistics
import sys

LINE = re.compile(r"specdec step: s (\S+) exact (\S+) gap (\S+) \| n (\d+) m (\d+) rows (\d+) "
                  r"verify (\d) emitted (\d+) \| pred (\S+) plain (\S+) sigma (\S+)")


def steps(path: str) -> list[dict]:
    out = []
    for line in open(path, errors="replace"):
        hit = LINE.search(line)
        if not hit:
            continue
        s, exact, gap, n, m, rows, verify, emitted, pred, plain, sigma = hit.groups()
        num = lambda x: None if x == "-" else float(x)  # noqa: E731
        out.append({"s": float(s), "exact": float(exact), "gap": float(gap), "n": int(n),
                    "m": int(m), "rows": int(rows), "verify": verify == "1",
                    "emitted": int(emitted), "pred": num(pred), "plain": num(plain),
                    "sigma": num(sigma) or 0.0})
    return out


def summary(rows: list[dict]) -> str:
    fwd = [r["s"] - r["exact"] for r in rows]
    priced = [r for r in rows if r["pred"] and r["plain"]]
    ratio = [(r["s"] - r["exact"]) / r["pred"] for r in priced]
    booked = [(r["pred"] + r["sigma"]) / r["plain"] for r in priced]
    measured = [r["s"] / r["plain"] for r in priced]
    med = lambda v: f"{statistics.median(v):.2f}" if v else "-"  # noqa: E731
    return (f"{len(rows):4d} steps, rows {med([r['rows'] for r in rows])}, n {med([r['n'] for r in rows])},"
            f" measured {med(fwd)} ms, measured/pred {med(ratio)}, F booked {med(booked)}"
            f" measured {med(measured)}, gap {med([r['gap'] for r in rows])} ms")


IDLE_MS = 1000.0  # a host gap this long is the server idle between cells, not step overhead
BANDS = ((1, 4), (5, 8), (9, 12), (13, 16), (17, 32), (33, 1 << 20))  # rows per step


def _bands(all_steps: list[dict]):
    """Per band of rows with plain steps: (lo, hi, its decode steps without a prompt,
    their plain ones, measured / predicted time of those plain steps)."""
    for lo, hi in BANDS:
        band = [r for r in all_steps if not r["m"] and r["pred"] and r["plain"] and lo <= r["rows"] <= hi]
        plain = [r for r in band if not r["verify"]]
        if plain:
            yield lo, hi, band, plain, sum(r["s"] for r in plain) / sum(r["plain"] for r in plain)


def by_batch(all_steps: list[dict]) -> list[str]:
    """Per band of rows: verifying and plain steps (no prompt), tokens emitted per row in
    the verifying ones, their measured time over the predicted plain step (F measured)
    and over the measured plain steps' own ratio (F against plain: the fit's error at
    that batch cancels), the realised S = tokens per row / F against plain (pooled over
    the band's steps: > 1, verifying paid), and the share of verifying steps with S < 1."""
    out = []
    for lo, hi, band, plain, drift in _bands(all_steps):
        ver = [r for r in band if r["verify"]]
        if not ver:
            continue
        tokens = sum(r["emitted"] for r in ver) / sum(r["rows"] for r in ver)
        f_meas = sum(r["s"] for r in ver) / sum(r["plain"] for r in ver)
        lose = sum(r["emitted"] / r["rows"] < r["s"] / r["plain"] / drift for r in ver) / len(ver)
        out.append(f"  rows {lo}-{hi}: {len(ver)} verifying / {len(plain)} plain, tokens/row "
                   f"{tokens:.2f}, F measured {f_meas:.2f}, against plain {f_meas / drift:.2f}, "
                   f"realised S {tokens * drift / f_meas:.2f}, {lose:.0%} with S < 1")
    return out


def saved(all_steps: list[dict]) -> tuple[float, float]:
    """(seconds the verifying steps saved, busy seconds: every step and the host gap
    before it, idle gaps left out). Saved: per verifying step without a prompt, tokens
    emitted / rows x the measured plain step at that batch (the fit's prediction x the
    band's measured / predicted plain steps), less the step's measured time.
    (busy + saved) / busy is the speedup the verifying steps alone imply over this
    server's own plain steps."""
    out = sum(r["emitted"] / r["rows"] * r["plain"] * drift - r["s"]
              for _, _, band, _, drift in _bands(all_steps) for r in band if r["verify"])
    busy = sum(r["s"] + (r["gap"] if r["gap"] < IDLE_MS else 0.0) for r in all_steps)
    return out / 1e3, busy / 1e3


def stretches(all_steps: list[dict]) -> list[list[dict]]:
    """The log's steps split at idle gaps (``IDLE_MS``): a serving benchmark's cells, in
    order, after the server's warm-up requests (the first stretch, whose first steps
    compile: its plain steps say nothing about the rest)."""
    out: list[list[dict]] = [[]]
    for r in all_steps:
        if r["gap"] >= IDLE_MS and out[-1]:
            out.append([])
        out[-1].append(r)
    return [part for part in out if part]


def main(paths: list[str]) -> None:
    for path in paths:
        all_steps = steps(path)
        print(f"{path}: {len(all_steps)} steps")
        third = max(len(all_steps) // 3, 1)
        for i in range(3):
            part = all_steps[i * third:(i + 1) * third if i < 2 else None]
            for kind, verify in (("plain", False), ("verify", True)):
                rows = [r for r in part if not r["m"] and r["verify"] == verify]
                print(f"  third {i + 1} {kind:6s}: {summary(rows)}")
        prompt = [r for r in all_steps if r["m"]]
        total = sum(r["s"] for r in all_steps) or 1.0
        if prompt:
            print(f"  with a prompt: {len(prompt)} steps, mean {statistics.mean(r['s'] for r in prompt):.0f} ms,"
                  f" {sum(r['s'] for r in prompt) / total:.0%} of the step seconds")
        print("\n".join(by_batch(all_steps)))
        for part in stretches(all_steps):  # one per benchmark cell
            gain, total = saved(part)
            if total:
                print(f"  busy stretch of {len(part)} steps, up to {max(r['rows'] for r in part)} rows:"
                      f" verifying steps saved {gain:.1f} s of {total:.1f} s, {(total + gain) / total:.3f}x"
                      " over this server's own plain steps")


if __name__ == "__main__":
    main(sys.argv[1:])
