"""Replay a served log's steps through the target step fit at several solve policies
(``STEP_FIT_SOLVE_EVERY``, with or without the ``STEP_FIT_SURPRISE`` trigger) and
compare how well each predicts the plain steps: at steady load, and in the first steps
at 4 rows or more (the start burst, where a young fit meets a batch size it has not seen).

    python experiments/step_log/fit_cadence.py results/RUN/serve-plugin-*-rep0.log [...]

The logs need the per-step DEBUG lines (``VLLM_LOGGING_CONFIG_PATH=experiments/
step_log/logging.json``). Each step is fed to a fresh ``StepCost`` as ``step_record``
feeds it (seconds less the exact sampler); before each plain step of 4 rows or more
without a prompt, the fit's prediction is compared with the measured step. Prints per
log and cadence: steps compared, median and 10th/90th percentiles of predicted /
measured, the worst of the first ``BURST`` such steps, the solves, and the final a, b,
q, p in ms.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from summarize import steps  # noqa: E402

import vllm_specdec_plugin.step_cost as step_cost  # noqa: E402
import vllm_specdec_plugin.target_fit as target_fit  # noqa: E402

# (solve every, surprise factor): the module's globals, read at each solve check
POLICIES = ((1, math.inf), (8, math.inf), (8, 2.0), (32, 2.0))
BURST = 10


def replay(rows: list[dict], every: int, surprise: float) -> tuple[list[float], dict, int]:
    target_fit.STEP_FIT_SOLVE_EVERY, target_fit.STEP_FIT_SURPRISE = every, surprise
    cost, ratios = step_cost.StepCost(), []
    for s in rows:
        n, m, r = s["n"], s["m"], s["rows"]
        if n + m == 0:
            continue
        seconds = (s["s"] - min(s["exact"], s["s"])) / 1e3
        if m == 0 and not s["verify"] and r >= 4 and seconds > 0:
            pred = cost.step_time(n, rows=r)
            if pred:
                ratios.append(pred / seconds)
        cost.observe_target_step(seconds, n, m, r)
    return ratios, cost.snapshot(), cost.target.version


def main(paths: list[str]) -> None:
    for path in paths:
        rows = steps(path)
        for every, surprise in POLICIES:
            ratios, snap, solves = replay(rows, every, surprise)
            policy = f"every {every:2d}" + ("" if surprise == math.inf else f" + x{surprise:g}")
            if len(ratios) < 10:
                print(f"{path}: {policy}: {len(ratios)} plain steps, too few")
                continue
            dec = statistics.quantiles(ratios, n=10)
            burst = max(ratios[:BURST], key=lambda x: max(x, 1 / x))
            fit = " ".join(f"{k} {1e3 * snap[k]:.3g}" for k in ("a", "b", "q", "p"))
            print(f"{Path(path).name}: {policy:14s}: {len(ratios)} plain steps, "
                  f"predicted/measured median {statistics.median(ratios):.3f} "
                  f"[p10 {dec[0]:.2f}, p90 {dec[-1]:.2f}], worst of the first {BURST} "
                  f"{burst:.2f}; {solves} solves; final ms: {fit}")


if __name__ == "__main__":
    main(sys.argv[1:])
