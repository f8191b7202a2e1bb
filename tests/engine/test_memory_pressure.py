"""Memory pressure: a target KV cache too small for the batch forces vLLM to preempt
and recompute requests; with the plugin, greedy output still equals the baseline
(float32, no speculation, no pressure). The draft pool's own pressure (pool_full
fallback) is covered in test_lifecycle.py."""

from harness import engine_kwargs, plugin_spec, run_engine
from prompts import PROMPTS

JOBS = [{"name": "all", "prompts": PROMPTS, "batch_size": 32,
         "params": {"temperature": 0, "max_tokens": 64, "ignore_eos": True}}]
INPROC = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # to read the proposer's counters


def test_preemption_keeps_greedy_exact(ci_pair):
    baseline = run_engine(engine_kwargs(ci_pair.target, max_num_seqs=32), JOBS)
    # 32 requests of ~70-90 tokens need ~32 * 3 blocks of 32 (the CPU backend's unit); give 40.
    tight = engine_kwargs(ci_pair.target, plugin_spec(ci_pair.draft, 3), max_num_seqs=32,
                          num_gpu_blocks_override=40, block_size=32)
    res = run_engine(tight, JOBS, env=INPROC)
    preempted = res["metrics"].get("vllm:num_preemptions", 0)
    assert preempted > 0, f"no preemption happened: {res['metrics']}"
    want = [o["token_ids"] for o in baseline["jobs"]["all"]]
    got = [o["token_ids"] for o in res["jobs"]["all"]]
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"{len(bad)} prompts differ after preemption, e.g. {bad[:3]}"
    snap = res["proposer"]
    assert snap["blocks_free"] == snap["blocks_total"] and snap["live_requests"] == 0, snap
    assert snap["accepted"] > 0
