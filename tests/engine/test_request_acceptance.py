"""Offline `RequestOutput`: every finished sequence (n = 1 and n > 1) carries its
acceptance when the plugin runs, the per-sequence numbers sum to vLLM's counters, and
an in-tree method keeps vLLM's default (no per-request metrics)."""

from harness import engine_kwargs, plugin_spec, run_engine
from prompts import PROMPTS


def _jobs():
    return [{"name": "greedy", "prompts": PROMPTS[:6], "batch_size": 6,
             "params": {"temperature": 0, "max_tokens": 24}},
            {"name": "n3", "prompts": PROMPTS[6:8], "batch_size": 2,
             "params": {"temperature": 0.9, "max_tokens": 24, "n": 3, "seed": 7}}]


def test_every_sequence_carries_its_acceptance(ci_pair):
    res = run_engine(engine_kwargs(ci_pair.target, plugin_spec(ci_pair.draft, 3)), _jobs())
    outs = res["jobs"]["greedy"] + res["jobs"]["n3"]
    assert len(res["jobs"]["n3"]) == 6
    for o in outs:
        sd = o["spec_decode"]
        assert sd is not None, o
        assert sd["num_spec_steps"] > 0 and sd["num_draft_tokens"] > 0
        assert sd["draft_acceptance_rate"] == sd["num_accepted_draft_tokens"] / sd["num_draft_tokens"]
        assert sum(sd["acceptance_histogram"]) == sd["num_spec_steps"]
    m = res["metrics"]
    assert sum(o["spec_decode"]["num_draft_tokens"] for o in outs) == m["vllm:spec_decode_num_draft_tokens"]
    assert sum(o["spec_decode"]["num_accepted_draft_tokens"] for o in outs) == \
        m["vllm:spec_decode_num_accepted_tokens"]


def test_in_tree_method_is_left_alone(ci_pair):
    spec = {"method": "draft_model", "model": str(ci_pair.draft), "num_speculative_tokens": 3}
    res = run_engine(engine_kwargs(ci_pair.target, spec), _jobs()[:1])
    assert all(o["spec_decode"] is None for o in res["jobs"]["greedy"])
