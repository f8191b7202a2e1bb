"""Draft KV lifecycle through the real engine: after a workload drains, every draft
block is free again; a small draft pool falls back to plain decoding, counted."""

from harness import engine_kwargs, plugin_spec, run_engine
from prompts import PROMPTS

INPROC = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # so the test can inspect the proposer


def test_blocks_all_free_after_drain_and_small_pool_falls_back(ci_pair):
    jobs = [{"name": "mixed", "prompts": PROMPTS, "batch_size": 16,
             "params": [{"temperature": 0 if i % 2 else 0.9, "max_tokens": 20 + i, "ignore_eos": True}
                        for i in range(32)]},
            ]
    res = run_engine(engine_kwargs(ci_pair.target, plugin_spec(ci_pair.draft, 4)), jobs, env=INPROC)
    snap = res["proposer"]
    assert snap is not None, "proposer not reachable in-process"
    assert snap["drafted"] > 0 and snap["accepted"] > 0
    assert snap["blocks_free"] == snap["blocks_total"], snap
    assert snap["live_requests"] == 0, snap
    # every step's drafts came back with its sampled tokens, except steps that complete a
    # prompt: those return first and draft in vLLM's post_step RPC (step plan)
    assert snap["draft_ids_carried"] > 0, snap
    assert snap["draft_ids_rpc"] == snap["drafting_deferred"], snap
    assert [len(o["token_ids"]) for o in res["jobs"]["mixed"]] == [20 + i for i in range(32)]

    # Pool of 0.5 MiB: 16 blocks of 32 tokens (one max_model_len request, the minimum);
    # 16 concurrent requests of ~2-3 blocks each cannot all draft.
    small = plugin_spec(ci_pair.draft, 4, draft_kv_cache_mib=0.5)
    res2 = run_engine(engine_kwargs(ci_pair.target, small), jobs, env=INPROC)
    snap2 = res2["proposer"]
    assert snap2["no_draft"].get("pool_full", 0) > 0, snap2
    assert snap2["blocks_free"] == snap2["blocks_total"], snap2
    greedy = [i for i in range(32) if i % 2]
    assert [res2["jobs"]["mixed"][i]["token_ids"] for i in greedy] == \
           [res["jobs"]["mixed"][i]["token_ids"] for i in greedy]
