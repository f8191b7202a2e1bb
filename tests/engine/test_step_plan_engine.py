"""The first-token bound through the engine: drafts cut for waiting prompts (by the
worker's policy when it knows the prompt, by the scheduler when it learns of it),
first tokens returned before drafting, and greedy output unchanged (float32, ci pair)."""

from harness import engine_kwargs, plugin_spec, run_engine
from prompts import PROMPTS

MAX_TOKENS = 40
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # the test reads module counters


def test_waiting_prompts_cut_drafts_and_output_is_unchanged(ci_pair):
    # 16 prompts at once into 8 slots: a 40-token budget admits a few per step, so rows
    # that sampled their first token hold their draft round while prompts remain; then
    # 8 wait while 8 rows draft, and the steps that admit them (a slot freed) carry
    # prefills beside drafts, which the budget makes the plan cut (the slack alone
    # depends on measured step times).
    jobs = [{"name": "b16", "prompts": PROMPTS[:16], "batch_size": 16,
             "params": {"temperature": 0, "max_tokens": MAX_TOKENS}}]
    small = dict(max_num_seqs=8, max_num_batched_tokens=40, enable_chunked_prefill=True)
    base = run_engine(engine_kwargs(ci_pair.target, **small), jobs)
    res = run_engine(engine_kwargs(ci_pair.target, plugin_spec(ci_pair.draft, 8), **small),
                     jobs, env=IN_PROCESS)
    got = [o["token_ids"] for o in res["jobs"]["b16"]]
    want = [o["token_ids"] for o in base["jobs"]["b16"]]
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"prompts {bad} differ"
    p = res["proposer"]
    assert p["plan_steps"] > 0 and p["plan_cut"] > 0, p      # the plan acted
    assert p["plan_kept"] + p["accepted"] > 0, p
    assert p["drafting_deferred"] >= 4, p                    # one per admitted prompt batch at least
    assert p["no_draft"].get("first_token", 0) > 0, p        # no draft round while a prompt is next
    assert p["accepted"] > 0, p                              # and speculation still paid


def test_a_loose_first_token_limit_verifies_every_draft(ci_pair):
    jobs = [{"name": "b8", "prompts": PROMPTS[:8], "batch_size": 8,
             "params": {"temperature": 0, "max_tokens": 16}}]
    res = run_engine(engine_kwargs(ci_pair.target, plugin_spec(ci_pair.draft, 4, ttft_limit=100.0),
                                   max_num_seqs=2), jobs, env=IN_PROCESS)
    p = res["proposer"]
    assert p["plan_cut"] == 0, p
    assert p["no_draft"].get("first_token", 0) == 0, p
    assert p["accepted"] > 0, p


def test_the_step_after_a_finish_is_planned_for_an_arrival(ci_pair):
    # 4 rows of staggered lengths: a finish that leaves rows running leads into a step
    # with no prefill, which the scheduler bounds for the next request (in a closed loop
    # it would arrive during it); with a loose limit it cuts nothing. Output unchanged.
    # Rows may finish in the same step (acceptance differs between CPUs), but the
    # 8-token row ends by step 8 and the 48-token one (at most 5 tokens a step) not
    # before step 11.
    lengths = [8, 16, 24, 48]
    jobs = [{"name": "b4", "prompts": PROMPTS[:4], "batch_size": 4,
             "params": [{"temperature": 0, "max_tokens": n, "ignore_eos": True} for n in lengths]}]
    base = run_engine(engine_kwargs(ci_pair.target, max_num_seqs=4), jobs)
    want = [o["token_ids"] for o in base["jobs"]["b4"]]
    snaps = {}
    for limit in (1.05, 100.0):
        res = run_engine(engine_kwargs(ci_pair.target, plugin_spec(ci_pair.draft, 4, ttft_limit=limit),
                                       max_num_seqs=4), jobs, env=IN_PROCESS)
        assert [o["token_ids"] for o in res["jobs"]["b4"]] == want
        snaps[limit] = res["proposer"]
    assert snaps[1.05]["plan_arrival"] >= 1, snaps
    assert snaps[100.0]["plan_cut"] == 0, snaps
