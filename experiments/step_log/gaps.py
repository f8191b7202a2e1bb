"""Host gaps between steps and the steps' own seconds, per plugin server log (the
``specdec step:`` DEBUG lines ``summarize.py`` reads): the gap before a step runs from
the previous step timer's end (the start of ``propose()``) to this step's scheduler
output (planning, the first-token RPC, the engine's update and schedule).

    python experiments/step_log/gaps.py results/RUN/serve-plugin-*-rep0.log [...]

Per log, over steps after a gap under 1 s (a benchmark cell, not idle time): the gap's
median / mean / sum over all steps, over steps that carried a prompt, and over decode
steps of 33 rows or more; then the sum of the steps' own seconds.
"""

from __future__ import annotations

import statistics
import sys

from summarize import IDLE_MS, steps


def gaps(rows: list[dict]) -> str:
    """Count, median / mean gap (ms) and their sum (s) over ``rows``."""
    v = [s["gap"] for s in rows]
    return (f"{len(v)} steps {statistics.median(v):.2f} / {statistics.mean(v):.2f} ms, "
            f"{sum(v) / 1e3:.2f} s") if v else "-"


def main(paths: list[str]) -> None:
    for path in paths:
        busy = [s for s in steps(path) if s["gap"] < IDLE_MS]
        prompt = [s for s in busy if s["m"] > 0]
        decode = [s for s in busy if s["m"] == 0 and s["rows"] >= 33]
        print(f"{path.split('/')[-1]}: gap all {gaps(busy)} | with a prompt {gaps(prompt)} | "
              f"decode 33+ rows {gaps(decode)} | step seconds {sum(s['s'] for s in busy) / 1e3:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
