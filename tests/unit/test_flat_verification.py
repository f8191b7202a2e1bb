"""Verification on vLLM's flat rows == a slow per-request, per-position reference.

The fast path (compat/rejection_adapter.exact_rejection_sample) works on the flat
[sum(n_b + 1), V] logits, builds histories only for penalised rows, cuts top-k/top-p
only on rows that set them, and argmaxes only greedy requests' rows. The reference
runs every position of every request alone: constraints, then target_probs (one-hot
greedy; seeded rows kept as processed logits) on its expanded history, then
rejection_sample_reference. From the same default-generator state every row must agree
bit for bit (a seeded row's y_j is vLLM's op with the seed of output token
len(output) + j of its own stream: here drawn position by position from a fresh
``SeedStream``, in the fast path for the row's positions at once from the runner's).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from vllm_specdec_plugin.compat.rejection_adapter import exact_rejection_sample
from vllm_specdec_plugin.compat.seeded import seeded_tokens
from vllm_specdec_plugin.compat.top_k_top_p import apply_top_k_top_p
from vllm_specdec_plugin.draft.sampler import DraftSampler
from vllm_specdec_plugin.rejection import PLACEHOLDER_TOKEN_ID
from specdec_testing.rejection_reference import rejection_sample_reference
from vllm_specdec_plugin.sampling.constraints import (apply_constraints,
                                                      constraints_from_sampling_params)
from vllm_specdec_plugin.sampling.histories import pad_histories
from vllm_specdec_plugin.sampling.pipeline import SamplingSpec, target_probs
from vllm_specdec_plugin.token_draw import SeedStream, SeedStreams

pytestmark = pytest.mark.unit


def _params(rng: random.Random, vocab: int, greedy_only: bool = False) -> SimpleNamespace:
    """A duck-typed SamplingParams with a random mix of options."""
    greedy = greedy_only or rng.random() < 0.3
    sp = SimpleNamespace(
        temperature=0.0 if greedy else rng.choice([0.6, 1.0, 1.4]),
        top_k=rng.choice([0, 0, 3, vocab + 5]), top_p=rng.choice([1.0, 1.0, 0.8]),
        min_p=rng.choice([0.0, 0.0, 0.05]),
        repetition_penalty=rng.choice([1.0, 1.0, 1.3]),
        presence_penalty=rng.choice([0.0, 0.0, 0.4]),
        frequency_penalty=rng.choice([0.0, 0.0, 0.7]),
        logit_bias=rng.choice([None, None, {1: 2.0}]), seed=rng.choice([None, rng.randrange(99)]),
        min_tokens=rng.choice([0, 0, 4]), all_stop_token_ids=[0],
        allowed_token_ids=None, _bad_words_token_ids=rng.choice([[], [[2, 3]]]))
    if greedy_only:  # plain greedy: no processor changes the argmax
        sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty = 1.0, 0.0, 0.0
        sp.logit_bias, sp.min_tokens, sp._bad_words_token_ids = None, 0, []
    return sp


def _batch(seed: int, batch: int, vocab: int, greedy_only: bool = False,
           with_q: bool = True, dtype=torch.float32, permute: bool = False):
    """(runner, metadata, draft_probs, logits) in vLLM's layout, varying n_b per row."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    num_draft = [rng.choice([0, 1, 2, 4, 5]) for _ in range(batch)]
    total = sum(num_draft)
    # Integer-valued logits on a small vocab: greedy rows often tie at the max.
    logits = torch.randint(-3, 4, (total + batch, vocab), generator=g).to(dtype)
    drafts = torch.randint(0, vocab, (total,), generator=g)
    q = torch.softmax(torch.randn(total, vocab, generator=g), -1) if with_q else None
    if q is not None:
        q[: total // 3] = 0.0  # point-mass rows (greedy / n-gram drafts)
    target_idx, bonus_idx, start = [], [], 0
    for n in num_draft:
        target_idx += range(start, start + n)
        bonus_idx.append(start + n)
        start += n + 1
    if permute:  # rows not in vLLM's usual order: the adapter must gather them
        perm = torch.randperm(total + batch, generator=g)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(total + batch)
        logits = logits[perm]
        target_idx = [int(inv[i]) for i in target_idx]
        bonus_idx = [int(inv[i]) for i in bonus_idx]
    metadata = SimpleNamespace(
        num_draft_tokens=num_draft, max_spec_len=max(num_draft),
        draft_token_ids=drafts, target_logits_indices=torch.tensor(target_idx),
        bonus_logits_indices=torch.tensor(bonus_idx))
    requests = {}
    for b in range(batch):
        state = requests[f"r{b}"] = SimpleNamespace(
            sampling_params=_params(rng, vocab, greedy_only),
            prompt_token_ids=[rng.randrange(vocab) for _ in range(rng.randint(0, 5))],
            output_token_ids=[rng.randrange(vocab) for _ in range(rng.randint(0, 6))])
        state.num_prompt_tokens = len(state.prompt_token_ids)
        state.num_tokens = state.num_prompt_tokens + len(state.output_token_ids)
    runner = SimpleNamespace(requests=requests, input_batch=SimpleNamespace(req_ids=list(requests)),
                             drafter=SimpleNamespace(seed_streams=SeedStreams()))
    return runner, metadata, q, logits


def _reference(runner, metadata, draft_probs, logits, capture=None) -> torch.Tensor:
    """Every position of every request alone: constraints, pipeline, reference sampler."""
    num_draft = list(metadata.num_draft_tokens)
    batch, max_k = len(num_draft), metadata.max_spec_len
    flat = metadata.draft_token_ids.tolist()
    tgt, bonus = metadata.target_logits_indices.tolist(), metadata.bonus_logits_indices.tolist()
    rows, specs, draft_ids, seeded, ys, start = [], [], [], [], [], 0
    for b, n in enumerate(num_draft):
        state = runner.requests[runner.input_batch.req_ids[b]]
        sp = state.sampling_params
        spec = SamplingSpec.from_sampling_params(sp)
        seeded.append(sp.seed is not None and not spec.is_greedy)
        stream = SeedStream(sp.seed, len(state.prompt_token_ids)) if seeded[-1] else None
        drafts = flat[start:start + n]
        own = logits[tgt[start:start + n] + [bonus[b]]].float().clone()  # [n + 1, V]
        apply_constraints(own, [constraints_from_sampling_params(sp)],
                          [state.output_token_ids], [drafts])
        for j in range(n + 1):
            history = list(state.output_token_ids) + drafts[:j]
            row = target_probs(own[j:j + 1], [spec], [state.prompt_token_ids], [history],
                               keep_logits=[seeded[-1]])
            rows.append(row)
            # y_j: vLLM's token for output len(output) + j (unused on other rows)
            ys.append(seeded_tokens(row, stream, len(state.output_token_ids) + j)
                      if stream is not None else torch.zeros(1, dtype=torch.long))
        specs.append(spec)
        draft_ids.append(drafts + [PLACEHOLDER_TOKEN_ID] * (max_k - n))
        start += n
    if capture is not None:
        capture["p"], capture["greedy"] = torch.cat(rows), [s.is_greedy for s in specs]
    out, _ = rejection_sample_reference(
        torch.tensor(draft_ids, dtype=torch.long).view(batch, max_k),
        torch.tensor(num_draft), draft_probs, torch.cat(rows),
        torch.tensor([s.is_greedy for s in specs]), seeded, torch.cat(ys))
    return out.to(torch.int32)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("with_q", [True, False])
def test_flat_fast_path_matches_per_position_reference(seed, with_q):
    runner, metadata, q, logits = _batch(seed, batch=7, vocab=11, with_q=with_q,
                                         permute=seed % 3 == 0)
    torch.manual_seed(seed)
    fast = exact_rejection_sample(runner, metadata, q, logits)
    torch.manual_seed(seed)
    want = _reference(runner, metadata, q, logits)
    assert torch.equal(fast, want), (fast, want)


def test_flat_batches_mix_seeded_unseeded_and_greedy_rows():
    kinds = set()
    for seed in range(12):
        runner, *_ = _batch(seed, batch=7, vocab=11)
        for st in runner.requests.values():
            sp = st.sampling_params
            kinds.add("greedy" if sp.temperature == 0 else "unseeded" if sp.seed is None
                      else "seeded")
    assert kinds == {"greedy", "seeded", "unseeded"}


@pytest.mark.parametrize("seed", range(8))
def test_flat_p_matches_per_position_reference(seed, monkeypatch):
    """p itself, any row asked for alone (the verification makes p a position at a
    time): sampled rows bit for bit (seeded ones: their processed logits, which
    vLLM's op samples), greedy rows (processed logits) by argmax."""
    from vllm_specdec_plugin import rejection

    seen = {}
    real = rejection.rejection_sample

    def spy(drafts, n, q, p, greedy, *seeding):
        seen["p"] = torch.cat([p.rows(torch.tensor([r])) for r in range(p.shape[0])])
        return real(drafts, n, q, p, greedy, *seeding)

    monkeypatch.setattr(rejection, "rejection_sample", spy)
    runner, metadata, q, logits = _batch(seed, batch=7, vocab=11, permute=seed % 2 == 0)
    exact_rejection_sample(runner, metadata, q, logits)
    want = {}
    _reference(runner, metadata, q, logits, capture=want)
    owner = [b for b, n in enumerate(metadata.num_draft_tokens) for _ in range(n + 1)]
    for r, b in enumerate(owner):
        if want["greedy"][b]:
            assert int(seen["p"][r].argmax()) == int(want["p"][r].argmax()), r
        else:
            assert torch.equal(seen["p"][r], want["p"][r]), r


@pytest.mark.parametrize("seed", range(8))
def test_verification_makes_only_the_positions_it_reaches(seed, monkeypatch):
    """The sampling pipeline runs on position j of a request only when its drafts before
    j were accepted: the rows made are, per request, positions 0..num_accepted, each
    once (the top-p sort over V is the cost of a sampled position)."""
    from vllm_specdec_plugin import rejection

    made, accepted = [], {}
    real = rejection.rejection_sample

    def spy(drafts, n, q, p, greedy, *seeding):
        inner = p.rows

        def rows(idx):
            made.extend(idx.tolist())
            return inner(idx)

        out, num_accepted = real(drafts, n, q, rejection.TargetRows(p.shape, p.device, rows,
                                                                    p.seeded), greedy, *seeding)
        accepted["n"] = num_accepted.tolist()
        return out, num_accepted

    monkeypatch.setattr(rejection, "rejection_sample", spy)
    runner, metadata, q, logits = _batch(seed, batch=7, vocab=11)
    exact_rejection_sample(runner, metadata, q, logits)
    starts, first = [], 0
    for n in metadata.num_draft_tokens:
        starts.append(first)
        first += n + 1
    want = [starts[b] + j for b, a in enumerate(accepted["n"]) for j in range(a + 1)]
    assert sorted(made) == want
    assert len(made) < first or all(a == n for a, n in zip(accepted["n"],
                                                          metadata.num_draft_tokens))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_greedy_flat_argmax_keeps_first_max_ties(seed, dtype):
    runner, metadata, _, logits = _batch(seed, batch=6, vocab=5, greedy_only=True,
                                         dtype=dtype, permute=seed % 4 == 1)
    fast = exact_rejection_sample(runner, metadata, None, logits)
    assert torch.equal(fast, _reference(runner, metadata, None, logits))


def test_logits_untouched_for_logprobs():
    # vLLM reads the same logits again for logprobs: constraints must work on a copy.
    for seed in range(6):
        runner, metadata, q, logits = _batch(seed, batch=7, vocab=11)
        before = logits.clone()
        exact_rejection_sample(runner, metadata, q, logits)
        assert torch.equal(logits, before)


def test_seeded_row_unchanged_by_neighbours_with_larger_k():
    runner, metadata, q, logits = _batch(3, batch=5, vocab=11)
    runner2, metadata2, q2, logits2 = _batch(4, batch=5, vocab=11)
    # Request 0 of batch 1 replaces request 2 of batch 2 (different K, neighbours).
    n1 = metadata.num_draft_tokens[0]
    rows1 = torch.cat([metadata.target_logits_indices[:n1], metadata.bonus_logits_indices[:1]])
    nd2 = list(metadata2.num_draft_tokens)
    s2 = sum(nd2[:2])
    nd2[2] = n1
    drafts2 = torch.cat([metadata2.draft_token_ids[:s2], metadata.draft_token_ids[:n1],
                         metadata2.draft_token_ids[s2 + metadata2.num_draft_tokens[2]:]])
    qs = None
    if q is not None:
        qs = torch.cat([q2[:s2], q[:n1], q2[s2 + metadata2.num_draft_tokens[2]:]])
    # Rebuild batch 2's flat logits with request 2 swapped in.
    parts, t_idx, b_idx, start, dstart = [], [], [], 0, 0
    for b, n in enumerate(nd2):
        if b == 2:
            part = logits[rows1]
        else:
            n_old = metadata2.num_draft_tokens[b]
            old_start = sum(m + 1 for m in metadata2.num_draft_tokens[:b])
            part = logits2[old_start:old_start + n_old + 1]
        parts.append(part)
        t_idx += range(start, start + n)
        b_idx.append(start + n)
        start += n + 1
    meta = SimpleNamespace(num_draft_tokens=nd2, max_spec_len=max(nd2), draft_token_ids=drafts2,
                           target_logits_indices=torch.tensor(t_idx),
                           bonus_logits_indices=torch.tensor(b_idx))
    runner2.requests["r2"] = runner.requests["r0"]
    runner.requests["r0"].sampling_params.temperature = 1.0  # a sampled row
    runner.requests["r0"].sampling_params.seed = 77           # shared by both batches
    alone = exact_rejection_sample(runner, metadata, q, logits)[0]
    among = exact_rejection_sample(runner2, meta, qs, torch.cat(parts))[2]
    assert alone[: n1 + 1].tolist() == among[: n1 + 1].tolist()


# ------------------------------------------------------------------ pipeline: old semantics


def _old_probs(logits, specs, prompts, outputs):
    """The pre-change pipeline: penalties on every row, top-k/top-p on every sampled row."""
    from vllm_specdec_plugin.compat.penalties import apply_penalties

    n, vocab = logits.shape
    x = logits.float().clone()
    for r, s in enumerate(specs):
        for tok, bias in s.logit_bias or ():
            x[r, tok] += bias
    t = lambda name, ss: torch.tensor([getattr(s, name) for s in ss], dtype=torch.float32)  # noqa: E731
    apply_penalties(x, pad_histories(prompts, n, vocab, "cpu"), pad_histories(outputs, n, vocab, "cpu"),
                    t("presence_penalty", specs), t("frequency_penalty", specs),
                    t("repetition_penalty", specs))
    out = torch.empty_like(x)
    greedy = torch.tensor([s.is_greedy for s in specs])
    out[greedy] = torch.nn.functional.one_hot(x[greedy].argmax(-1), vocab).float()
    rs = [s for s in specs if not s.is_greedy]
    r = x[~greedy] / t("temperature", rs).unsqueeze(1)
    p = torch.softmax(r, -1)
    r = r.masked_fill(p < p.amax(-1, keepdim=True) * t("min_p", rs).unsqueeze(1), float("-inf"))
    top_k = torch.tensor([s.top_k if 0 < s.top_k < vocab else vocab for s in rs])
    top_p = t("top_p", rs)
    r = apply_top_k_top_p(r, top_k if bool((top_k < vocab).any()) else None,
                          top_p if bool((top_p < 1).any()) else None)
    out[~greedy] = torch.softmax(r, -1, dtype=torch.float32)
    return out


@pytest.mark.parametrize("seed", range(10))
def test_row_restricted_pipeline_equals_all_rows_pipeline(seed):
    rng = random.Random(seed)
    vocab, n = 50, 16
    specs = [SamplingSpec.from_sampling_params(_params(rng, vocab)) for _ in range(n)]
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(0, 8))] for _ in range(n)]
    outputs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 8))] for _ in range(n)]
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    assert torch.equal(target_probs(logits, specs, prompts, outputs),
                       _old_probs(logits, specs, prompts, outputs))


def test_draft_sampler_histories_only_for_penalised_rows():
    vocab, k = 23, 3
    specs = [SamplingSpec(temperature=0.9), None, SamplingSpec(frequency_penalty=0.8, top_p=0.9),
             SamplingSpec(top_k=4)]
    prompts = [[1, 2], [3], [4, 4, 5], [6]]
    outputs = [[7], [8, 9], [10, 10], []]
    streams = [(SeedStream(seed, len(prompts[i])), len(outputs[i])) if seed is not None else None
               for i, seed in enumerate([0, 1, None, 3])]
    sampler = DraftSampler(specs, prompts, outputs, streams, k, vocab, torch.device("cpu"))
    assert sampler.penalised and sampler.prompts[0].tolist() == [-1, -1, -1]  # row 0: none
    g = torch.Generator().manual_seed(5)
    drafts = torch.zeros(4, k, dtype=torch.long)
    for pos in range(k):
        logits = torch.randn(4, vocab, generator=g)
        want = [target_probs(logits[i:i + 1], [specs[i]], [prompts[i]],
                             [outputs[i] + drafts[i, :pos].tolist()])[0]
                for i in (0, 2, 3)]
        drafts[:, pos] = sampler.pick(logits.clone(), pos, drafts)
        for m, want_q in enumerate(want):
            assert torch.equal(sampler.q[m, pos], want_q), (pos, m)
    plain = DraftSampler([SamplingSpec(top_p=0.5), None], [[1], []], [[2], []], [None, None], k, vocab,
                         torch.device("cpu"))
    assert not plain.penalised and not hasattr(plain, "prompts")


def test_draft_probs_all_sampled_round_hands_over_the_buffer():
    from vllm_specdec_plugin import draft_probs

    cpu = torch.device("cpu")
    q = torch.softmax(torch.randn(3, 4, 9), -1)
    q[2, 2:] = 0.0                                   # row 2 drafted 2 tokens
    drafts = [[1, 2, 3], [4, 5, 6], [7, 8]]
    got = draft_probs.build([0, 1, 2], q, drafts, 9, cpu)
    assert got.shape == (3, 3, 9) and torch.equal(got, q[:, :3])
    assert got.data_ptr() == q.data_ptr()            # no copy
    # Mixed: a point-mass row (n-gram / greedy) still gets its one-hots.
    mixed = draft_probs.build([0, 2], q[[0, 2]], drafts, 9, cpu)
    assert torch.equal(mixed[0], q[0, :3]) and torch.equal(mixed[2], q[2, :3])
    assert mixed[1].sum(-1).tolist() == [1.0] * 3 and mixed[1, [0, 1, 2], [4, 5, 6]].tolist() == [1.0] * 3
