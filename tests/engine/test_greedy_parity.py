"""Greedy output with the plugin is token-identical to vLLM without speculation.

Runs in float32 on the ci fixture pair: fixtures.md measured that in bf16 greedy
output depends on batch shape (near-ties flip), in float32 it does not, so the
baseline runs once at batch 16 and every plugin run (batch 1, 4, 16) must equal it.
"""

import pytest

from harness import engine_kwargs, plugin_spec, run_engine
from prompts import PROMPTS

MAX_TOKENS = 40
MAX_MODEL_LEN = 512


def _stop_jobs(tokenizer):
    """Stops that fall inside speculation rounds, and prompts ending exactly at max_model_len."""
    nl = tokenizer.encode("\n", add_special_tokens=False)
    assert len(nl) == 1, "fixture tokenizer should have a single newline token"
    long_prompt = tokenizer.encode("def f(x):\n    return x\n" * 40, add_special_tokens=False)[:400]
    room = MAX_MODEL_LEN - len(long_prompt)
    return [
        {"name": "stop_token", "prompts": PROMPTS[:16], "batch_size": 16,
         "params": {"temperature": 0, "max_tokens": MAX_TOKENS, "stop_token_ids": nl}},
        {"name": "stop_string", "prompts": PROMPTS[:16], "batch_size": 16,
         "params": {"temperature": 0, "max_tokens": MAX_TOKENS, "stop": [")", " = ", "self."]}},
        {"name": "max_len", "prompts": [long_prompt, long_prompt[:-7]], "batch_size": 2,
         "params": [{"temperature": 0, "max_tokens": room, "ignore_eos": True},
                    {"temperature": 0, "max_tokens": room + 7, "ignore_eos": True}]},
    ]


def _free_jobs(batch_sizes):
    return [{"name": f"b{bs}", "prompts": PROMPTS, "batch_size": bs,
             "params": {"temperature": 0, "max_tokens": MAX_TOKENS}} for bs in batch_sizes]


@pytest.fixture(scope="module")
def tokenizer(ci_pair):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ci_pair.target))


@pytest.fixture(scope="module")
def baseline(ci_pair, tokenizer):
    return run_engine(engine_kwargs(ci_pair.target, max_model_len=MAX_MODEL_LEN),
                      _free_jobs([16]) + _stop_jobs(tokenizer))


def _ids(res, name):
    return [o["token_ids"] for o in res["jobs"][name]]


def _accepted_tokens(res):
    v = res["metrics"].get("vllm:spec_decode_num_accepted_tokens")
    return v if isinstance(v, (int, float)) else 0


MODES = {"draft": {}, "ngram": {"method": "ngram"}, "hybrid": {"method": "hybrid"},
         "hybrid-adaptive": {"method": "hybrid", "adaptive": True},
         "draft-adaptive": {"adaptive": True}}


@pytest.mark.parametrize("k,mode", [(1, "draft"), (3, "draft"), (5, "draft"), (3, "ngram"),
                                    (3, "hybrid"), (4, "hybrid-adaptive"), (4, "draft-adaptive")])
def test_greedy_identical_to_no_speculation(ci_pair, tokenizer, baseline, k, mode):
    stops = k == 3 and mode in ("draft", "hybrid")
    jobs = _free_jobs([1, 4, 16]) + (_stop_jobs(tokenizer) if stops else [])
    # In-process engine for the new modes, so the test can read the proposer's counters.
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if mode != "draft" else None
    res = run_engine(engine_kwargs(ci_pair.target, plugin_spec(ci_pair.draft, k, **MODES[mode]),
                                   max_model_len=MAX_MODEL_LEN), jobs, env=env)
    want = _ids(baseline, "b16")
    for bs in (1, 4, 16):
        got = _ids(res, f"b{bs}")
        bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
        assert not bad, f"{mode} k={k} batch={bs}: prompts {bad} differ, first: {got[bad[0]]} vs {want[bad[0]]}"
    # Several tokens were emitted in one step for some request (drafts accepted).
    assert _accepted_tokens(res) > 0, res["metrics"]
    if mode == "hybrid":  # both stages proposed
        assert all(res["proposer"]["by_source"].get(s, 0) > 0 for s in ("ngram", "draft")), res["proposer"]
    if stops:
        for name in ("stop_token", "stop_string", "max_len"):
            assert _ids(res, name) == _ids(baseline, name), name
            assert [o["finish_reason"] for o in res["jobs"][name]] == \
                   [o["finish_reason"] for o in baseline["jobs"][name]]
        # The stop tests are not vacuous: requests stopped early, some of them in a
        # later round than the first (1 token from the prefill + up to k + 1 in round
        # one). How many stop early depends on the fixture's greedy text, which differs
        # by CPU: 7 of 16 on one CI CPU, 8 or more on others; a quarter is the floor.
        early = [o for o in res["jobs"]["stop_string"] if len(o["token_ids"]) < MAX_TOKENS]
        assert len(early) >= 4, [len(o["token_ids"]) for o in res["jobs"]["stop_string"]]
        assert any(len(o["token_ids"]) > k + 2 for o in early), [len(o["token_ids"]) for o in early]
        ends = [o["prompt_len"] + len(o["token_ids"]) for o in res["jobs"]["max_len"]]
        assert ends == [MAX_MODEL_LEN, MAX_MODEL_LEN]


def test_qwen2_draft_runs_through_vllms_model_class(ci_pair, baseline):
    """A second architecture: the Qwen2 twin of the ci draft (zero q/k/v biases, same
    weights) loads as vLLM's Qwen2ForCausalLM, keeps greedy output identical, and
    drafts what the Llama draft drafts: acceptance counts within 1 %.

    Not bit-equal: the biased q/k/v projection is a different GEMM call (bias fused),
    whose float32 rounding differs in the last bits, and that flips the draft's argmax
    at rare near-ties (772 vs 774 accepted tokens on one CI CPU, equal on others).
    The latency bounds are lifted (``ttft_limit``, ``tpot_limit`` 100): they cut drafts
    and chunk catch-ups by measured step times, which differ between runs by timing
    alone."""
    from specdec_fixtures.qwen2_draft import ensure_qwen2_draft

    qwen2 = ensure_qwen2_draft(ci_pair.draft)
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    runs = {}
    for name, draft in (("llama", ci_pair.draft), ("qwen2", qwen2)):
        res = run_engine(engine_kwargs(ci_pair.target, plugin_spec(draft, 3, ttft_limit=100.0,
                                                                  tpot_limit=100.0),
                                       max_model_len=MAX_MODEL_LEN), _free_jobs([4]), env=env)
        assert _ids(res, "b4") == _ids(baseline, "b16")[: len(PROMPTS)], name
        runs[name] = res["proposer"]
    assert runs["qwen2"]["model_class"] == "Qwen2ForCausalLM"
    assert runs["llama"]["model_class"] == "LlamaForCausalLM"
    assert runs["llama"]["accepted"] > 0
    for key in ("accepted", "drafted"):
        assert runs["qwen2"][key] == pytest.approx(runs["llama"][key], rel=0.01), (key, runs)


def test_reduced_draft_vocab_keeps_greedy_identical(ci_pair, baseline, tmp_path):
    """``draft_vocab`` without every third token id (some of the target's greedy
    tokens out of the draft's reach): output identical, drafts still accepted."""
    import json

    vocab = tmp_path / "draft_vocab.json"
    vocab.write_text(json.dumps([i for i in range(2048) if i % 3]))
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    res = run_engine(engine_kwargs(ci_pair.target, plugin_spec(ci_pair.draft, 4, draft_vocab=str(vocab)),
                                   max_model_len=MAX_MODEL_LEN), _free_jobs([1, 16]), env=env)
    want = _ids(baseline, "b16")
    for bs in (1, 16):
        assert _ids(res, f"b{bs}") == want, bs
    assert res["proposer"]["accepted"] > 0, res["proposer"]
