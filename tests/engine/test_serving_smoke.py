"""The serving benchmark's harness, end to end, in smoke mode (never a speed check).

Starts real `vllm serve` processes (no speculation, the plugin in hybrid + adaptive
mode) on the ci pair and drives them with vLLM's own `vllm bench serve` at two
concurrencies and one Poisson rate, on held-out ShareGPT chats (vLLM's own ShareGPT
loader) and the replayed completion and chat workloads.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_specdec_plugin.metrics import DRAFT_SOURCES, NO_DRAFT_REASONS

REPO = Path(__file__).resolve().parents[2]


def test_serving_benchmark_smoke(ci_pair, tmp_path):
    out = tmp_path / "serving"
    p = subprocess.run([sys.executable, "-m", "benchmarks.serving", "--smoke", "--out", str(out)],
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=1500)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    res = json.loads((out / "serving.json").read_text())
    cells = res["cells"]
    # 2 configs x 3 workloads x (2 concurrencies + 1 rate) x 1 repetition
    assert len(cells) == 18, [(c["config"], c["workload"]) for c in cells]
    assert {c["config"] for c in cells} == {"nospec", "plugin-hybrid-adaptive-k8"}
    assert {c["workload"] for c in cells} == {"sharegpt", "mixed", "chat"}
    for c in cells:
        assert c["completed"] == c["num_prompts"] and not c.get("failed"), c
        for key in ("output_throughput", "median_tpot_ms", "p99_tpot_ms", "median_ttft_ms",
                    "p99_ttft_ms", "median_itl_ms"):
            assert key in c, (key, sorted(c))
        assert ("max_concurrency" in c) != ("request_rate" in c)
        # the server's speculation counters over the cell (zero without speculation)
        steps = {f"{k}_{f}" for k in ("verify", "plain") for f in ("step_s", "steps", "emitted")}
        shadows = {"shadow_drafted", "shadow_accepted", "plan_kept", "plan_cut", "plan_deferred"}
        keys = {"drafts", "draft_tokens", "accepted", "draft_s", "draft_rounds"} | steps | shadows
        if c["config"] != "nospec":  # the plugin's rounds without drafts, by reason, and
            keys |= {f"no_draft_{r}" for r in NO_DRAFT_REASONS}   # its drafts by source
            keys |= {f"{kind}_{src}" for kind in ("drafted", "accepted") for src in DRAFT_SOURCES}
        assert set(c["spec"]) == keys, sorted(c["spec"])
        if c["config"] == "nospec":
            assert not any(c["spec"].values()), c["spec"]
        else:  # the plugin's decode steps, by kind, over the cell
            assert c["spec"]["verify_steps"] + c["spec"]["plain_steps"] > 0, c["spec"]
        # where the server's CPU went during the cell, by process
        assert set(c["server_cpu_s"]) == {"api", "engine", "worker", "other"}, c["server_cpu_s"]
        assert c["server_cpu_s"]["worker"] > 0 and c["server_cpu_s"]["engine"] > 0, c["server_cpu_s"]
    md = (out / "serving.md").read_text()
    assert "Crossover" in md and "plugin-hybrid-adaptive-k8" in md
    assert "## mixed (replay: 8 prompts cycled)" in md and "## sharegpt, by" in md
    assert "Analytic bound at concurrency 1" in md
    assert "Plugin decode steps: verifying vs plain" in md
    assert (out / "serving.png").stat().st_size > 0
