"""The step plan: prefills first, then the verify tokens most likely accepted."""

from types import SimpleNamespace

from vllm_specdec_plugin.compat import scheduler_plan
from vllm_specdec_plugin import step_plan
from vllm_specdec_plugin.step_plan import (Row, StepPrice, arrival_allowance, keep_drafts,
                                           keep_for_arrival, verify_allowance)
from vllm_specdec_plugin.tuning import TTFT_SLACK

COST = StepPrice(intercept_s=0.010, per_token_s=0.001, per_prefill_token_s=0.0005)


def test_no_prefill_keeps_every_draft():
    rows = [Row("a", 4, 0.9), Row("b", 8, 0.1)]
    assert keep_drafts(rows, decode_rows=2, prefill_tokens=0, prefilling=0,
                       token_budget=16, cost=COST) == {"a": 4, "b": 8}


def test_allowance_is_the_slack_of_the_step_without_drafts():
    # base = 10 ms + 16 x 1 ms + 200 x 0.5 ms = 126 ms; 5 % of it = 6.3 ms = 6 tokens
    assert verify_allowance(decode_rows=16, prefill_tokens=200, token_budget=2048,
                            cost=COST, slack=0.05) == 6
    # the token budget binds before the slack
    assert verify_allowance(decode_rows=16, prefill_tokens=2030, token_budget=2048,
                            cost=COST, slack=0.5) == 2
    assert verify_allowance(decode_rows=16, prefill_tokens=4000, token_budget=2048,
                            cost=COST) == 0
    # without a cost model only the budget binds
    assert verify_allowance(decode_rows=4, prefill_tokens=10, token_budget=64, cost=None) == 50


def test_the_exact_samplers_sigma_comes_out_of_the_slack():
    # 5 % of 126 ms = 6.3 ms; σ 2 ms leaves 4.3 ms = 4 tokens, σ 7 ms none
    sigma2 = StepPrice(0.010, 0.001, 0.0005, verify_s=0.002)
    assert verify_allowance(decode_rows=16, prefill_tokens=200, token_budget=2048,
                            cost=sigma2, slack=0.05) == 4
    sigma7 = StepPrice(0.010, 0.001, 0.0005, verify_s=0.007)
    assert verify_allowance(decode_rows=16, prefill_tokens=200, token_budget=2048,
                            cost=sigma7, slack=0.05) == 0
    assert arrival_allowance(decode_rows=4, prompt_tokens=200, cost=sigma7, slack=0.05) == 0


def test_keeps_the_positions_most_likely_accepted():
    rows = [Row("hi", 4, 0.9), Row("lo", 4, 0.3)]
    cost = StepPrice(0.0, 0.001, 0.0)
    # decode_rows 2 + prefill 0 ... base 2 ms; slack 1.0 -> 2 tokens, then 3
    keep = keep_drafts(rows, decode_rows=2, prefill_tokens=98, prefilling=1,
                       token_budget=103, cost=None)
    assert sum(keep.values()) == 3
    # 0.9, 0.81, 0.729 all beat 0.3
    assert keep == {"hi": 3, "lo": 0}
    keep = keep_drafts(rows, decode_rows=2, prefill_tokens=0, prefilling=1,
                       token_budget=100, cost=cost, slack=2.5)  # 5 tokens
    # 0.9 .81 .729 .656 then 0.3 (beats .59 of a fifth, which does not exist)
    assert keep == {"hi": 4, "lo": 1}


def test_unknown_alpha_takes_the_mean_and_rows_take_turns():
    rows = [Row("a", 3), Row("b", 3), Row("c", 3)]
    keep = keep_drafts(rows, decode_rows=3, prefill_tokens=10, prefilling=1,
                       token_budget=17, cost=None)  # 4 verify tokens
    assert sorted(keep.values()) == [1, 1, 2]
    assert sum(keep.values()) == 4


def _req(rid, prompt, computed, outputs=0, spec=()):
    return SimpleNamespace(request_id=rid, num_prompt_tokens=prompt,
                           num_computed_tokens=computed, num_tokens=prompt + outputs,
                           num_output_tokens=outputs, spec_token_ids=list(spec))


def _scheduler(running, waiting, budget=64, slots=8, hint=None, slack=TTFT_SLACK, split=True,
               arrival=False, finished=(), prompts=None):
    s = SimpleNamespace(running=running, waiting=waiting, kv_holding_waiting=[],
                        max_num_scheduled_tokens=budget, max_num_active_reqs=slots,
                        finished_req_ids=set(finished))
    setattr(s, scheduler_plan._SLACK, slack)   # what the configured ttft_slack caches
    setattr(s, scheduler_plan._SPLIT, split)   # and prefill_split
    setattr(s, scheduler_plan._ARRIVAL, arrival)  # and arrival_cap
    if prompts is not None:  # what note_prompts recorded: {req id: first-step prefill}
        setattr(s, scheduler_plan._PROMPTS, dict(prompts))
    if hint is not None:
        setattr(s, scheduler_plan._HINT, hint)
    setattr(s, scheduler_plan._METRICS, SimpleNamespace(verify_tokens=lambda k, c: None,
                                                        prompts_deferred=lambda n: None))
    return s


def test_scheduler_cuts_drafts_for_a_waiting_prompt():
    a = _req("a", 10, 13, outputs=4, spec=[1, 2, 3, 4])
    b = _req("b", 10, 13, outputs=4, spec=[5, 6, 7, 8])
    new = _req("n", 50, 0)
    s = _scheduler([a, b], [new], budget=60)  # 60 - 2 rows - 50 prompt = 8 -> all kept
    scheduler_plan._plan(s)
    assert a.spec_token_ids == [1, 2, 3, 4] and b.spec_token_ids == [5, 6, 7, 8]
    s = _scheduler([a, b], [new], budget=57, hint=(None, {"a": 0.9, "b": 0.1}))  # room 5
    before = dict(scheduler_plan.counts)
    scheduler_plan._plan(s)
    assert a.spec_token_ids == [1, 2, 3, 4] and b.spec_token_ids == [5]
    assert scheduler_plan.counts["cut"] - before["cut"] == 3
    assert scheduler_plan.counts["kept"] - before["kept"] == 5


def test_the_configured_ttft_slack_sets_what_a_prefill_step_verifies():
    cost = StepPrice(0.01, 0.001, 0.001)  # without drafts: 0.01 + 2 rows + 50 prompt = 62 ms
    kept = {}
    for slack in (0.0, 0.05, 1.0):
        a = _req("a", 10, 13, outputs=4, spec=[1, 2, 3, 4])
        b = _req("b", 10, 13, outputs=4, spec=[5, 6, 7, 8])
        scheduler_plan._plan(_scheduler([a, b], [_req("n", 50, 0)], budget=200,
                                        hint=(cost, {"a": 0.9, "b": 0.5}), slack=slack))
        kept[slack] = len(a.spec_token_ids) + len(b.spec_token_ids)
    # 0: nothing beside the prompt; 0.05: 3 ms = 3 tokens; 1.0: all 8 fit in 62 ms
    assert kept == {0.0: 0, 0.05: 3, 1.0: 8}


def test_scheduler_keeps_drafts_when_nobody_waits_or_no_slot():
    a = _req("a", 10, 13, outputs=4, spec=[1, 2, 3, 4])
    scheduler_plan._plan(_scheduler([a], [], budget=3))
    assert a.spec_token_ids == [1, 2, 3, 4]
    scheduler_plan._plan(_scheduler([a], [_req("n", 50, 0)], budget=3, slots=1))
    assert a.spec_token_ids == [1, 2, 3, 4]  # the waiting one cannot be admitted anyway


def test_a_running_chunked_prefill_counts_as_prefilling():
    a = _req("a", 10, 13, outputs=4, spec=[1, 2, 3, 4])
    chunk = _req("c", 100, 40)
    scheduler_plan._plan(_scheduler([a, chunk], [], budget=63))  # 63 - 1 - 60 = 2
    assert a.spec_token_ids == [1, 2]


def test_first_tokens_marks_prompts_completed_this_step():
    reqs = {"done": _req("done", 10, 10),          # scheduled 10: whole prompt now
            "chunk": _req("chunk", 100, 50),       # scheduled 50 of 100
            "last": _req("last", 100, 100),        # scheduled the last 40
            "dec": _req("dec", 10, 12, outputs=2)}
    out = SimpleNamespace(num_scheduled_tokens={"done": 10, "chunk": 50, "last": 40, "dec": 1})
    s = SimpleNamespace(requests=reqs)
    assert scheduler_plan.first_tokens(s, out) == {"done", "last"}


def test_prompts_next_when_a_prompt_is_unfinished_or_a_waiting_one_fits():
    dec = _req("a", 10, 13, outputs=4)
    assert not scheduler_plan.prompts_next(_scheduler([dec], []))
    assert scheduler_plan.prompts_next(_scheduler([dec, _req("c", 100, 40)], []))
    assert scheduler_plan.prompts_next(_scheduler([dec], [_req("n", 50, 0)], slots=2))
    assert not scheduler_plan.prompts_next(_scheduler([dec], [_req("n", 50, 0)], slots=1))
    assert not scheduler_plan.read_prompts_next(SimpleNamespace())  # plan off: attribute absent


def test_drafts_cut_before_verification_are_not_booked():
    from vllm_specdec_plugin.request_state import RequestState, keep_scheduled

    req = RequestState(tokens=list(range(12)), committed=8, drafted=[8, 9, 10, 11])
    assert keep_scheduled(req, 4, None) == 0 and req.drafted == [8, 9, 10, 11]
    assert keep_scheduled(req, 2, None) == 2 and req.drafted == [8, 9]
    assert len(req.tokens) == 12          # verified drafts' KV stays until roll_back
    assert keep_scheduled(req, 0, None) == 2 and req.drafted == []
    assert req.tokens == list(range(8))   # none verified: the drafts' KV goes now


def test_admissions_split_prompts_where_a_shared_step_costs_more():
    cpu = StepPrice(0.02, 0.003, 0.002)        # 200 prompt tokens: 0.4 s, fixed 20-50 ms
    assert step_plan.admissions([200, 200, 200], prefilling=0, decode_rows=6, cost=cpu) == 1
    # a burst: the fixed time counts once for every request still waiting behind
    # (i = 2 joins while 0.4·1 <= 0.041·(m - 1): m = 11 admits 2, then 0.8 > 0.044·9)
    assert step_plan.admissions([200] * 11, prefilling=0, decode_rows=6, cost=cpu) == 2
    assert step_plan.admissions([200] * 64, prefilling=0, decode_rows=6, cost=cpu) > 4
    # a running chunked prefill is already a prompt in the step
    assert step_plan.admissions([200], prefilling=1, decode_rows=6, cost=cpu) == 0
    # short prompts are cheaper than a step's fixed time: they share it
    assert step_plan.admissions([5, 5, 5, 200], prefilling=0, decode_rows=6, cost=cpu) == 3
    gpu = StepPrice(0.015, 0.0001, 0.00001)    # 200 tokens: 2 ms < 15 ms: all, as vLLM
    assert step_plan.admissions([200] * 8, prefilling=0, decode_rows=6, cost=gpu) == 8
    assert step_plan.admissions([200] * 3, prefilling=0, decode_rows=6, cost=None) == 3


def test_scheduler_admits_bunched_prompts_one_step_at_a_time():
    a = _req("a", 10, 13, outputs=4, spec=[1, 2, 3, 4])
    waiting = [_req("n1", 200, 0), _req("n2", 200, 0), _req("n3", 200, 0)]
    cost = StepPrice(0.02, 0.003, 0.002)
    before = scheduler_plan.counts["deferred"]
    assert scheduler_plan._plan(_scheduler([a], waiting, budget=2048, hint=(cost, {}))) == 1
    assert scheduler_plan.counts["deferred"] - before == 2
    # off, or no fit yet: vLLM's admission (None)
    assert scheduler_plan._plan(_scheduler([a], waiting, budget=2048, hint=(cost, {}),
                                           split=False)) is None
    assert scheduler_plan._plan(_scheduler([a], waiting, budget=2048)) is None
    # one waiting prompt and no prefill running: nothing to split
    assert scheduler_plan._plan(_scheduler([a], waiting[:1], budget=2048, hint=(cost, {}))) is None


def test_arrival_allowance_is_the_slack_of_a_step_carrying_a_typical_prompt():
    # a step of 4 rows and a 200-token prompt: 10 + 4 + 100 = 114 ms; 5 % = 5.7 ms = 5 tokens
    assert arrival_allowance(decode_rows=4, prompt_tokens=200, cost=COST, slack=0.05) == 5
    assert arrival_allowance(decode_rows=4, prompt_tokens=200, cost=COST, slack=0.0) == 0
    assert arrival_allowance(decode_rows=4, prompt_tokens=200, cost=None) is None
    rows = [Row("a", 4, 0.9), Row("b", 4, 0.2)]
    assert keep_for_arrival(rows, decode_rows=2, prompt_tokens=200, cost=COST,
                            slack=0.05) == {"a": 4, "b": 1}
    assert keep_for_arrival(rows, decode_rows=2, prompt_tokens=200, cost=None) == {"a": 4, "b": 4}


def test_the_step_after_a_request_finished_is_cut_for_the_next_arrival():
    cost = StepPrice(0.01, 0.001, 0.001)  # 2 rows + a 50-token prompt: 62 ms; 5 %: 3 tokens

    def plan(**kw):
        a = _req("a", 10, 13, outputs=4, spec=[1, 2, 3, 4])
        b = _req("b", 10, 13, outputs=4, spec=[5, 6, 7, 8])
        scheduler_plan._plan(_scheduler([a, b], [], budget=200, slack=0.05,
                                        hint=(cost, {"a": 0.9, "b": 0.5}), **kw))
        return len(a.spec_token_ids) + len(b.spec_token_ids)

    before = scheduler_plan.counts["arrival"]
    assert plan(arrival=True, finished={"x"}, prompts={"x": 50}) == 3
    assert scheduler_plan.counts["arrival"] == before + 1
    assert plan(arrival=True, finished=(), prompts={"x": 50}) == 8  # nobody finished
    assert plan(arrival=False, finished={"x"}, prompts={"x": 50}) == 8  # arrival_cap off
    assert plan(arrival=True, finished={"x"}) == 8  # never seen (no first step recorded)


def test_the_arrival_is_priced_with_the_finished_requests_prompt_and_nothing_outlives_them():
    s = SimpleNamespace(finished_req_ids=set())
    setattr(s, scheduler_plan._ARRIVAL, True)
    scheduler_plan.note_prompts(s, SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="n"), SimpleNamespace(req_id="m")],
        num_scheduled_tokens={"n": 100, "m": 300, "a": 1}))
    assert scheduler_plan.finished_prompt(s) is None         # nobody finished
    s.finished_req_ids = {"n", "m", "gone"}                   # "gone": never scheduled
    assert scheduler_plan.finished_prompt(s) == 200.0
    assert getattr(s, scheduler_plan._PROMPTS) == {}          # forgotten once finished
    assert scheduler_plan.finished_prompt(s) is None
    off = SimpleNamespace(finished_req_ids=set())              # arrival_cap off: no record
    setattr(off, scheduler_plan._ARRIVAL, False)
    scheduler_plan.note_prompts(off, SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="n")], num_scheduled_tokens={"n": 100}))
    assert not getattr(off, scheduler_plan._PROMPTS, None)
