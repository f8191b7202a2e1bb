"""Replay a served log's steps through the target step fit at several solve cadences
(``STEP_FIT_SOLVE_EVERY``) and compare how well each predicts the plain steps.

    python experiments/step_log/fit_cadence.py results/RUN/serve-plugin-*-rep0.log [...]

The logs need the per-step DEBUG lines (``VLLM_LOGGING_CONFIG_PATH=experiments/
step_log/logging.json``). Each step is fed to a fresh ``StepCost`` as ``step_record``
feeds it (seconds less the exact sampler); before each plain step of 4 rows or more
without a prompt, the fit's prediction is compared with the measured step. Prints per
log and cadence: steps compared, median and 10th/90th percentiles of predicted /
measured, and the final a, b, q, p in ms.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from summarize import steps  # noqa: E402

import vllm_specdec_plugin.step_cost as step_cost  # noqa: E402
import vllm_specdec_plugin.target_fit as target_fit  # noqa: E402

CADENCES = (1, 8, 32)


def replay(rows: list[dict], every: int) -> tuple[list[float], dict]:
    target_fit.STEP_FIT_SOLVE_EVERY = every  # the module's global, read at each solve check
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
    return ratios, cost.snapshot()


def main(paths: list[str]) -> None:
    for path in paths:
        rows = steps(path)
        for every in CADENCES:
            ratios, snap = replay(rows, every)
            if len(ratios) < 10:
                print(f"{path}: solve every {every}: {len(ratios)} plain steps, too few")
                continue
            dec = statistics.quantiles(ratios, n=10)
            fit = " ".join(f"{k} {1e3 * snap[k]:.3g}" for k in ("a", "b", "q", "p"))
            print(f"{Path(path).name}: solve every {every:2d}: {len(ratios)} plain steps, "
                  f"predicted/measured median {statistics.median(ratios):.3f} "
                  f"[p10 {dec[0]:.2f}, p90 {dec[-1]:.2f}]; final ms: {fit}")


if __name__ == "__main__":
    main(sys.argv[1:])
