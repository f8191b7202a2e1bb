"""DraftModelProposer against a fake runner: lazy prefill (chunked under the budget),
batched drafting with per-row k, rollback to the accepted length, lifecycle frees,
pool-full and length guards, the q channel.

The draft is the ci fixture draft, run through vLLM's model class and CPU attention
backend in this process; the reference is transformers' forward of the same weights.
The "target" accepts a chosen number of drafts."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdec_testing import standalone
from vllm_specdec_plugin.proposer import DraftModelProposer
from vllm_specdec_plugin.tenancy import UNSALTED

V = 2048  # the fixture vocabulary


@pytest.fixture(scope="module")
def tiny(ci_pair):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(ci_pair.draft), torch_dtype=torch.float32).eval()
    return m, ci_pair


def _greedy(model, seq, n):
    seq = list(seq)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[-n:]


class FakeRunner:
    def __init__(self, req_ids, temps=None, max_tokens=None):
        self.input_batch = SimpleNamespace(req_ids=list(req_ids),
                                           num_prompt_tokens=np.zeros(64, dtype=np.int64))
        temps, max_tokens = temps or {}, max_tokens or {}
        self.requests = {r: SimpleNamespace(sampling_params=SimpleNamespace(
            temperature=temps.get(r, 0.0), top_k=0, top_p=1.0, min_p=0.0, seed=None,
            repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
            logit_bias=None, max_tokens=max_tokens.get(r))) for r in req_ids}


def scheduled(new=(), finished=(), preempted=(), salt=None):
    """A SchedulerOutput as the proposer reads it, with the report the engine process
    attaches (compat.request_scope): ``new`` requests' salt, no aborts."""
    out = SimpleNamespace(finished_req_ids=set(finished), preempted_req_ids=set(preempted))
    out.specdec_scope = ({r: salt for r in new}, frozenset())
    return out


def attach(p, runner):
    """Bind the runner and report its requests as new (unsalted), as the engine does."""
    p.bind_runner(runner)
    p.on_scheduler_output(scheduled(new=runner.requests))
    return runner


def make_proposer(monkeypatch, pair, k, max_model_len=128, mib=1.0, **opts):
    """The proposer with the draft model at a fixed k unless ``opts`` say otherwise."""
    opts = {"method": "draft", "adaptive": False, **opts}
    spec = {"method": "custom_class", "model": "vllm_specdec_plugin.DraftModelProposer",
            "num_speculative_tokens": k, "draft_load_config": {"model_loader_extra_config": {
                "specdec": {"draft_model": str(pair.draft), "draft_kv_cache_mib": mib, **opts}}}}
    vc = standalone.vllm_config(str(pair.target), spec, max_model_len=max_model_len)
    p = DraftModelProposer(vc)
    p.load_model(None)
    return p


class Batch:
    """Committed tokens per row, as vLLM's input batch holds them."""

    def __init__(self, prompts):
        self.rows = [list(p) for p in prompts]

    def arrays(self, width=128):
        arr = np.zeros((len(self.rows), width), dtype=np.int64)
        for i, r in enumerate(self.rows):
            arr[i, : len(r)] = r
        return np.array([len(r) for r in self.rows]), arr


def test_drafts_are_the_draft_models_greedy_continuation(tiny, monkeypatch):
    model, path = tiny
    p = make_proposer(monkeypatch, path, k=3)
    attach(p, FakeRunner(["a", "b"]))
    b = Batch([[1, 2, 3, 4, 5], [7, 8]])
    n, arr = b.arrays()
    drafts = p.propose([[5], [8]], n, arr)
    assert drafts[0] == _greedy(model, b.rows[0], 3)
    assert drafts[1] == _greedy(model, b.rows[1], 3)
    assert p.stats.prefill_tokens == 7                      # lazy prefill of both prompts

    # Target accepts 1 draft of row a (then a correction token 0), all 3 of row b + bonus 9.
    b.rows[0] += [drafts[0][0], 0]
    b.rows[1] += drafts[1] + [9]
    n, arr = b.arrays()
    drafts2 = p.propose([[drafts[0][0], 0], drafts[1] + [9]], n, arr)
    assert drafts2[0] == _greedy(model, b.rows[0], 3)
    assert drafts2[1] == _greedy(model, b.rows[1], 3)
    ra, rb = p.requests["a"], p.requests["b"]
    assert (ra.acceptance.drafted, ra.acceptance.accepted) == (3, 1)
    assert (rb.acceptance.drafted, rb.acceptance.accepted) == (3, 3)
    # Only unseen committed tokens were fed: a: correction token; b: d3 + bonus.
    assert p.stats.prefill_tokens == 7 + 1 + 2
    assert p.stats.resyncs == 0


def test_each_draft_round_logs_one_debug_line(tiny, monkeypatch, caplog):
    """A round logs its seconds, the committed tokens it fed, its rows, drafts and
    passes at DEBUG on the step logger (benchmarks/step_log.json turns it on), so a long
    ``sample_tokens`` in a served timeline can be told apart from a host pause."""
    import logging
    import re

    _, path = tiny
    p = make_proposer(monkeypatch, path, k=3)
    attach(p, FakeRunner(["a", "b"]))
    n, arr = Batch([[1, 2, 3, 4, 5], [7, 8]]).arrays()
    with caplog.at_level(logging.DEBUG, logger="vllm.specdec_plugin.steps"):
        p.propose([[5], [8]], n, arr)
    lines = [r.getMessage() for r in caplog.records if "specdec round:" in r.getMessage()]
    assert len(lines) == 1
    m = re.search(r"s (\S+) fed (\d+) rows (\d+) drafts (\d+) passes (\d+)", lines[0])
    assert float(m.group(1)) > 0
    assert [int(m.group(i)) for i in range(2, 6)] == [7, 2, 6, 3]  # both prompts, k 3 each


def test_the_draft_cost_fit_books_drafting_passes_not_a_lazy_prefill(tiny, monkeypatch):
    """A round whose pass 1 catches up a prompt books only its decode passes into the
    draft's cost fit (a prompt's tokens read as dearer forwards while b_d is unknown);
    a round of one new token a row books every pass."""
    _, path = tiny
    p = make_proposer(monkeypatch, path, k=4)
    attach(p, FakeRunner(["a", "b"]))
    b = Batch([list(range(1, 41)), list(range(50, 70))])  # 40 + 20 prompt tokens
    n, arr = b.arrays()
    drafts = p.propose([[40], [69]], n, arr)
    fit = p.cost.draft
    assert fit.w == 1 and fit.mean[:2] == [3, 6]  # passes 2-4 over 2 rows: 3 forwards, 6 tokens
    for row, d in zip(b.rows, drafts):
        row += [d[0], 0]  # one draft accepted, then a correction: 1 unseen token a row
    n, arr = b.arrays()
    p.propose([[d[0], 0] for d in drafts], n, arr)
    f = fit.decay
    assert fit.w == pytest.approx(f + 1)  # then all 4 passes, 8 tokens
    assert fit.mean[:2] == pytest.approx([(f * 3 + 4) / (f + 1), (f * 6 + 8) / (f + 1)])


def test_finished_and_preempted_requests_free_blocks(tiny, monkeypatch):
    _, path = tiny
    p = make_proposer(monkeypatch, path, k=2)
    attach(p, FakeRunner(["a", "b"]))
    n, arr = Batch([[1, 2, 3], [4, 5, 6, 7, 8, 9]]).arrays()
    p.propose([[3], [9]], n, arr)
    assert p.allocator.num_used > 0
    p.on_scheduler_output(scheduled(finished={"a"}, preempted={"b"}))
    assert p.allocator.num_free == p.allocator.num_blocks
    # The preempted request is re-prefilled lazily when it comes back.
    before = p.stats.prefill_tokens
    attach(p, FakeRunner(["b"]))
    n, arr = Batch([[4, 5, 6, 7, 8, 9, 11]]).arrays()
    assert len(p.propose([[11]], n, arr)[0]) == 2
    assert p.stats.prefill_tokens == before + 7


def test_length_guard_shrinks_k_then_stops(tiny, monkeypatch):
    _, path = tiny
    p = make_proposer(monkeypatch, path, k=4, max_model_len=12)
    attach(p, FakeRunner(["a"]))
    n, arr = Batch([list(range(1, 10))]).arrays()              # L=9: room for 12-9-1=2
    assert len(p.propose([[9]], n, arr)[0]) == 2
    n, arr = Batch([list(range(1, 12))]).arrays()              # L=11: no room
    assert p.propose([[0]], n, arr) == [[]]
    assert p.stats.no_draft["length_guard"] == 1


def test_pool_full_request_gets_no_draft_and_is_counted(tiny, monkeypatch):
    _, path = tiny
    # ci draft: 2 layers * 32 tok * 2 kv heads * 32 dim * 2 (K, V) * 4 B = 32 KiB/block;
    # 128 KiB = 4 blocks = one request of max_model_len 128.
    p = make_proposer(monkeypatch, path, k=2, max_model_len=128, mib=128 / 1024)
    attach(p, FakeRunner(["a", "b"]))
    long = list(range(1, 60)) * 2                              # 118 tokens: 4 blocks
    n, arr = Batch([long[:118], [1, 2, 3, 4, 5, 6, 7, 8, 9]]).arrays()
    d = p.propose([[1], [9]], n, arr)
    # Smallest catch-up first: b takes a block, a no longer fits this round.
    assert d[0] == [] and len(d[1]) == 2
    assert p.stats.no_draft["pool_full"] == 1


def test_budget_below_one_request_is_a_clear_error(tiny, monkeypatch):
    from vllm_specdec_plugin.errors import SpecDecConfigError

    _, path = tiny
    with pytest.raises(SpecDecConfigError, match="Fix: set draft_kv_cache_mib >="):
        make_proposer(monkeypatch, path, k=2, max_model_len=128, mib=64 / 1024)


def test_sampled_request_publishes_q(tiny, monkeypatch):
    _, path = tiny
    p = make_proposer(monkeypatch, path, k=3)
    runner = FakeRunner(["a", "b"], temps={"a": 1.0})
    attach(p, runner)
    n, arr = Batch([[1, 2, 3], [4, 5]]).arrays()
    d = p.propose([[3], [5]], n, arr)
    assert sorted(runner._draft_prob_req_ids) == ["a", "b"]     # channel order is the round's
    q = runner._draft_probs.cpu()
    qa, qb = (q[runner._draft_prob_req_ids.index(r)] for r in "ab")
    assert q.shape == (2, 3, V)
    torch.testing.assert_close(q.sum(-1), torch.ones(2, 3))
    assert all(qa[j, d[0][j]] > 0 for j in range(3))            # sampled from q
    assert all(qb[j, d[1][j]] == 1 for j in range(3))           # greedy: point mass


# ---------------------------------------------------------------- n-gram / hybrid


def test_ngram_only_needs_no_draft_model_and_chains_lookups(tiny, monkeypatch):
    _, path = tiny
    p = make_proposer(monkeypatch, path, k=3, method="ngram")
    assert p.model is None and p.allocator is None
    attach(p, FakeRunner(["a", "b"]))
    n, arr = Batch([[1, 2, 3, 4, 1, 2, 3], [5, 6, 7]]).arrays()
    d = p.propose([[3], [7]], n, arr)
    assert d == [[4, 1, 2], []]                       # b: nothing to look up
    assert p.stats.no_draft["ngram_miss"] == 1
    # Target accepts 2 of a's drafts then corrects: acceptance is booked per request.
    n, arr = Batch([[1, 2, 3, 4, 1, 2, 3, 4, 1, 9], [5, 6, 7, 8]]).arrays()
    p.propose([[4, 1, 9], [8]], n, arr)
    assert (p.requests["a"].acceptance.drafted, p.requests["a"].acceptance.accepted) == (3, 2)


def test_ngram_drafts_the_continuation_of_a_finished_request(tiny, monkeypatch):
    """A finished request's tokens (read from the runner's batch before vLLM drops
    them) go to the cross-request corpus; a later request whose context matches drafts
    what followed, unless its own history matches a context at least as long."""
    _, path = tiny
    p = make_proposer(monkeypatch, path, k=3, method="ngram")
    runner = FakeRunner(["a", "b", "c"])
    n, arr = Batch([[20, 21, 22, 23, 24, 25, 26, 27]]).arrays()
    runner.input_batch.req_id_to_index = {"a": 0}
    runner.input_batch.token_ids_cpu, runner.input_batch.num_tokens_no_spec = arr, n
    attach(p, runner)
    p.on_scheduler_output(scheduled(finished={"a"}))
    assert len(p.planner.corpus) == 8
    runner.input_batch.req_ids = ["b", "c"]
    n, arr = Batch([[5, 21, 22, 23], [21, 22, 23, 9, 5, 21, 22, 23]]).arrays()
    d = p.propose([[23], [23]], n, arr)
    assert d == [[24, 25, 26],    # b: [21, 22, 23] continues as in "a"
                 [9, 5, 21]]      # c: its own history matches [21, 22, 23] too: its own wins
    off = make_proposer(monkeypatch, path, k=3, method="ngram", ngram_corpus_tokens=0)
    assert off.planner.corpus is None


def test_hybrid_keeps_the_draft_kv_consistent_across_ngram_rounds(tiny, monkeypatch):
    """n-gram rounds do not touch the draft KV; the next model round feeds every
    committed token it has not seen, so its drafts equal the draft model's greedy
    continuation of the whole sequence (as if it had drafted every round)."""
    model, path = tiny
    p = make_proposer(monkeypatch, path, k=3, method="hybrid")
    attach(p, FakeRunner(["a"]))
    seq = [10, 11, 12, 13]                            # no repeats: model round
    n, arr = Batch([seq]).arrays()
    d = p.propose([[13]], n, arr)
    assert d[0] == _greedy(model, seq, 3) and p.requests["a"].source == "draft"
    # Target accepts 1 draft; the text now repeats, so the n-gram stage proposes.
    seq = seq + [d[0][0]] + [10, 11, 12, 13, 10, 11]
    n, arr = Batch([seq]).arrays()
    d2 = p.propose([[d[0][0], 10]], n, arr)            # 1 accepted (the rest is "committed")
    assert p.requests["a"].source == "ngram" and d2[0] == [12, 13, 10]
    tokens_before = list(p.requests["a"].tokens)
    # Target accepts 2 n-gram drafts, then a novel token: back to the model.
    seq = seq + [12, 13, 40]
    n, arr = Batch([seq]).arrays()
    d3 = p.propose([[12, 13, 40]], n, arr)
    assert p.requests["a"].source == "draft"
    assert d3[0] == _greedy(model, seq, 3)             # KV caught up lazily and exactly
    assert tokens_before == seq[: len(tokens_before)]
    assert p.requests["a"].acceptance.drafted == 6 and p.requests["a"].acceptance.accepted == 3
    assert p.stats.resyncs == 0


def test_hybrid_chooses_the_source_by_measured_acceptance_per_request(tiny, monkeypatch):
    """Both requests repeat text, so the n-gram stage finds drafts for both; "a"'s n-gram
    drafts have kept failing, "b"'s have not: a drafts with the model, b with n-gram."""
    _, path = tiny
    p = make_proposer(monkeypatch, path, k=3, method="hybrid")
    attach(p, FakeRunner(["a", "b"]))
    a, b = (_joined(p, rid) for rid in "ab")
    for _ in range(12):
        a.learned.observe("ngram", 3, 0)
        b.learned.observe("ngram", 3, 3)
    rep = [1, 2, 3, 1, 2, 3, 1, 2]
    n, arr = Batch([rep, rep]).arrays()
    d = p.propose([[2], [2]], n, arr)
    assert p.requests["a"].source == "draft" and len(d[0]) == 3
    assert p.requests["b"].source == "ngram" and d[1] == [3, 1, 2]


def test_hybrid_counts_a_round_without_match_as_ngram_miss_when_the_draft_is_held(tiny, monkeypatch):
    """Hybrid + adaptive: a row whose n-gram finds no match while its draft model is held
    for its α is counted "ngram_miss" (not "adaptive", which is left to offers that do not
    pay), so the counters tell a missing match from a priced-out one."""
    _, path = tiny
    p = _hybrid_with_costs(monkeypatch, path, ["a"], sigma_s=0.0001)
    for n in (1, 2, 3):                     # a draft forward costs two plain steps
        p.cost.observe_draft(0.02 * n, n, n)
    a = _joined(p, "a")
    for _ in range(8):                      # and the draft's rounds are always rejected
        a.learned.observe("draft", 4, 0)
    seq = [1, 2, 3, 4, 5, 6, 7]             # no n-gram match anywhere
    n, arr = Batch([seq]).arrays()
    assert p.propose([[seq[-1]]], n, arr) == [[]]
    assert p.stats.no_draft["ngram_miss"] == 1 and p.stats.no_draft["adaptive"] == 0


def test_hybrid_mixed_batch_publishes_q_for_ngram_rows_too(tiny, monkeypatch):
    _, path = tiny
    p = make_proposer(monkeypatch, path, k=3, method="hybrid")
    runner = FakeRunner(["a", "b"], temps={"a": 1.0, "b": 1.0})
    attach(p, runner)
    n, arr = Batch([[1, 2, 3, 1, 2, 3, 1, 2], [20, 21, 22]]).arrays()
    d = p.propose([[2], [22]], n, arr)
    assert d[0] == [3, 1, 2]                            # n-gram
    assert runner._draft_prob_req_ids == ["b", "a"]      # model rows first, then n-gram rows
    q = runner._draft_probs.cpu()
    assert all(q[1, j, d[0][j]] == 1 and q[1, j].sum() == 1 for j in range(3))  # point masses


def test_no_drafts_past_the_requests_max_tokens(tiny, monkeypatch):
    """A round emits up to k + 1 tokens; drafts the request could never emit (past its
    max_tokens) are not proposed, so the target does not verify them."""
    model, path = tiny
    p = make_proposer(monkeypatch, path, k=3)
    attach(p, FakeRunner(["a", "b"], max_tokens={"a": 7}))  # prompt length 0 here
    seqs = [[1, 2, 3, 4, 5], [7, 8]]
    n, arr = Batch(seqs).arrays()
    d = p.propose([[5], [8]], n, arr)
    assert d[0] == _greedy(model, seqs[0], 1) and d[1] == _greedy(model, seqs[1], 3)
    seqs[0].append(d[0][0])  # one token left: a plain step
    n, arr = Batch(seqs).arrays()
    d = p.propose([[seqs[0][-1]], [8]], n, arr)
    assert d[0] == [] and p.stats.no_draft["length_guard"] == 1


def test_adaptive_k_drops_to_zero_for_a_request_that_never_accepts(tiny, monkeypatch):
    _, path = tiny
    p = make_proposer(monkeypatch, path, k=4, adaptive=True)
    attach(p, FakeRunner(["a"]))
    seq = [1, 2, 3]
    ks = []
    for step in range(30):
        n, arr = Batch([seq]).arrays()
        d = p.propose([[seq[-1]]] if not ks or not ks[-1] else [[(seq[-1] + 1) % V]], n, arr)
        ks.append(len(d[0]))
        seq = seq + [(seq[-1] + 1) % V]               # the "target" rejects every draft
    assert ks[0] == 4 and 0 in ks[5:]
    assert p.stats.no_draft["adaptive"] > 0


def _joined(p, rid):
    """The request record of ``rid`` (unsalted), made as its first verification would."""
    return p._verified(rid, 0, np.zeros(1, dtype=np.int64))


def _hybrid_with_costs(monkeypatch, path, ids, sigma_s, **opts):
    """Hybrid + adaptive k = 4 over rows ``ids``, the cost fits having measured
    T(n) = 10 ms + 1 ms a token and σ = ``sigma_s`` seconds."""
    p = make_proposer(monkeypatch, path, k=4, method="hybrid", adaptive=True, **opts)
    attach(p, FakeRunner(ids))
    for n in (1, 8, 16):
        p.cost.observe_step(0.01 + 0.001 * n, n, 0, n)
    for rows in (1, 1, 8):                  # (the first sample is skipped as set-up)
        p.cost.observe_step(0.011 + 0.001 * rows + sigma_s, rows + 1, 0, rows, sigma_s,
                            verified=True)
    return p


def test_a_step_that_cannot_beat_a_plain_one_verifies_nothing(tiny, monkeypatch):
    """When the best positions cannot pay the verifying step's fixed cost σ over the
    whole batch, no row drafts (no n-gram round, no draft prefill): the row whose drafts
    alone would gain is counted "batch", the others "adaptive"; once σ is cheap, that
    row drafts again. (No latency bound here: σ alone would break it.)"""
    _, path = tiny
    ids = [f"r{i}" for i in range(8)]
    p = _hybrid_with_costs(monkeypatch, path, ids, sigma_s=0.018,  # σ = one plain step
                           tpot_limit=1000.0)
    for rid in ids:                         # r0's n-gram drafts are always accepted,
        r = _joined(p, rid)                 # the 7 others' drafts always rejected
        for source in ("ngram", "draft"):
            for _ in range(30):
                r.learned.observe(source, 4, 4 if rid == "r0" and source == "ngram" else 0)
    seqs = [[1, 2, 3, 1, 2, 3, 1, 2] for _ in ids]  # every row has an n-gram match
    n, arr = Batch(seqs).arrays()
    assert p.propose([[s[-1]] for s in seqs], n, arr) == [[]] * 8
    assert p.stats.no_draft == {"batch": 1, "adaptive": 7}, p.stats.no_draft
    assert p.stats.prefill_tokens == 0
    for _ in range(40):                     # σ -> 0: the step may pay again
        p.cost.observe_step(0.019, 9, 0, 8, 0.0, verified=True)
    d = p.propose([[s[-1]] for s in seqs], n, arr)
    assert d[0] == [3, 1, 2, 3] and not any(d[1:])


@pytest.mark.parametrize("bound", ["tokens", "time"])
def test_long_catch_up_is_chunked_under_the_prefill_budget(tiny, monkeypatch, bound):
    """A prompt longer than the budget is fed in chunks over several rounds, drafting
    nothing until caught up; a short request in the same batch drafts every round.
    The budget is vLLM's token budget, or the step's catch-up room (the tokens that
    delay it by what the time-per-token bound lets a step take), whichever is smaller."""
    model, path = tiny
    p = make_proposer(monkeypatch, path, k=3, max_model_len=256)
    if bound == "tokens":  # vLLM's token budget (max_num_batched_tokens)
        p.planner.prefill_budget = 40
    else:
        monkeypatch.setattr(p.cost, "catch_up_room", lambda batch, most: 40 if batch > 1 else None)
    attach(p, FakeRunner(["long", "short"]))
    g = torch.Generator().manual_seed(3)
    long = torch.randint(4, V, (100,), generator=g).tolist()
    short = [5, 6, 7]
    rounds = []
    for step in range(4):
        n, arr = Batch([long, short]).arrays(256)
        d = p.propose([[long[-1]], [short[-1]]], n, arr)
        rounds.append(d)
        assert p.stats.prefill_tokens <= 40 * (step + 1)
        assert d[1] == _greedy(model, short, 3)
        # The target accepts nothing: commit a correction token for both.
        long, short = long + [11], short + [12]
    # 100 tokens, then 1 per round: chunks of 37 (40 minus the short row's 3), 39, 24+.
    assert [len(r[0]) for r in rounds] == [0, 0, 3, 3]
    assert rounds[2][0] == _greedy(model, long[:-2], 3)
    assert p.stats.no_draft["prefill_budget"] == 2


def test_rows_with_different_k_draft_their_own_continuations(tiny, monkeypatch):
    model, path = tiny
    p = make_proposer(monkeypatch, path, k=4, max_model_len=40)
    attach(p, FakeRunner(["a", "b", "c"]))
    rows = [list(range(10, 47)), [3, 4, 5], list(range(20, 56))]   # L=37: k 2; L=36: k 3
    n, arr = Batch(rows).arrays(64)
    d = p.propose([[46], [5], [55]], n, arr)
    assert [len(x) for x in d] == [2, 4, 3]
    for row, drafts in zip(rows, d):
        assert drafts == _greedy(model, row, len(drafts))


def test_held_rows_measure_ngram_acceptance_by_shadow_proposals(tiny, monkeypatch):
    """Rows held at k = 0 verify nothing, yet their n-gram acceptance is measured: a few
    rows per step get a shadow proposal, decided by the tokens the target commits next
    and booked (request, scope and match bucket) as the round it would have been."""
    from vllm_specdec_plugin.tuning import SHADOW_ROWS

    _, path = tiny
    ids = [f"r{i}" for i in range(6)]
    p = _hybrid_with_costs(monkeypatch, path, ids, sigma_s=0.02)  # every step is held
    seqs = [[1, 2, 3, 1, 2, 3, 1, 2] for _ in ids]
    n, arr = Batch(seqs).arrays()
    assert p.propose([[s[-1]] for s in seqs], n, arr) == [[]] * 6
    first = [r for r in ids if p.requests[r].shadow is not None]
    assert len(first) == SHADOW_ROWS
    assert all(p.requests[r].shadow.drafts == [3, 1, 2, 3] for r in first)  # at most k
    for s in seqs:
        s.append(3)                          # a plain step commits the first shadow draft
    n, arr = Batch(seqs).arrays()
    p.propose([[3]] * 6, n, arr)
    assert p.stats.shadow_drafted == 0       # pending: one of four drafts known
    rest = [r for r in ids if r not in first]
    assert all(p.requests[r].shadow.drafts == [1, 2, 3, 1] for r in rest)  # their turn
    alpha0 = p.requests[first[0]].learned.alpha("ngram")
    for s in seqs:
        s.append(9)                          # rejects the second / the first draft
    n, arr = Batch(seqs).arrays()
    p.propose([[9]] * 6, n, arr)
    assert (p.stats.shadow_drafted, p.stats.shadow_accepted) == (4 * 6, SHADOW_ROWS)
    assert p.requests[first[0]].learned.alpha("ngram") < alpha0
    scope = p.scope_records.get(UNSALTED)
    assert list(scope.matches) == [("own", 4)]      # the bucket learned too
    assert scope.matches[("own", 4)].value(0.6, 4.0) < 0.6
    assert p.stats.drafted == 0              # the target verified nothing
