"""What each request's first token waited for, per benchmark cell: the engine step in
flight when the request arrived (its remaining time, and whether that step verified
drafts or ran a long ``sample_tokens``, i.e. a draft round), then the rest up to the
first token (the step that carried its prompt, and the engine and HTTP path around it).

Request arrivals (``start_times`` in serving.json) and the ``timeline`` lines
(``sitecustomize.py``) share one clock: both are time.perf_counter() on one machine.

    python experiments/engine_timeline/first_token.py results/RUN [CONFIG ...]

Per cell, medians over the cell's requests, in ms: TTFT; "in flight", the time from
arrival to the end of the step (and its post_step) then running (0 when the engine
was idle); "after", TTFT less that; and the share of arrivals that landed in a step
that verified drafts, or whose ``sample_tokens`` took over ``summarize.STALL_MS``.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from split import cell_load, serve_logs  # noqa: E402
from summarize import STALL_MS, read_paired  # noqa: E402


def waits(cell: dict, eng: list[dict]) -> list[dict]:
    """Per request: arrival a (s), ttft (s), in-flight residual (s), that step's row
    (``eng``: the server's steps, ``read_paired``)."""
    starts = [s["t"] for s in eng]
    out = []
    for a, ttft in zip(cell["start_times"], cell["ttfts"]):
        i = bisect.bisect_right(starts, a) - 1
        res, step = 0.0, None
        if i >= 0:
            s = eng[i]
            end = s["t"] + (s["step"] + s["post"]) / 1e3
            if end > a:
                res, step = end - a, s
        out.append(dict(a=a, ttft=ttft, res=res, step=step))
    return out


def main(run: str, configs: list[str]) -> None:
    cells = json.load(open(os.path.join(run, "serving.json")))["cells"]
    print("load config rep | TTFT p50 | in flight p50 mean | after p50 | landed in: verify, "
          "long sample | in-flight step p50 (ms)")
    logs = serve_logs(run, lambda path: read_paired(path)[0])
    for c in sorted(cells, key=lambda c: (cell_load(c), c["config"], c["repetition"])):
        eng = logs(c)
        if (configs and c["config"] not in configs) or eng is None:
            continue
        w = waits(c, eng)
        med = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
        landed = [x["step"] for x in w if x["step"] is not None]
        spec = sum(1 for s in landed if s["spec"]) / len(w)
        long = sum(1 for s in landed if s.get("sample", 0.0) > STALL_MS) / len(w)
        dur = [(s["step"] + s["post"]) / 1e3 for s in landed] or [0.0]
        print(f"{cell_load(c)[2]} {c['config']} {c['repetition']} | {med([x['ttft'] for x in w]):.0f} | "
              f"{med([x['res'] for x in w]):.0f} {statistics.mean(x['res'] for x in w) * 1e3:.0f} | "
              f"{med([x['ttft'] - x['res'] for x in w]):.0f} | {spec:.0%}, {long:.0%} | "
              f"{med(dur):.0f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
