"""The request sampling pipeline against hand-computed examples and vLLM's own code."""

from __future__ import annotations

import math
import types

import pytest
import torch

from vllm_specdec_plugin.sampling import (
    SamplingSpec,
    expand_histories,
    make_generator,
    position_probs,
    target_probs,
)

pytestmark = pytest.mark.unit


def probs_of(logits, spec, prompt=(), output=()):
    """Single-row helper: [V] logits -> [V] probs."""
    row = torch.tensor([logits], dtype=torch.float32)
    return target_probs(row, [spec], [list(prompt)], [list(output)])[0]


def softmax(xs):
    m = max(x for x in xs if x != -math.inf)
    e = [0.0 if x == -math.inf else math.exp(x - m) for x in xs]
    s = sum(e)
    return torch.tensor([v / s for v in e])


def assert_probs(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=atol, rtol=0)


LOG4 = [math.log(x) for x in (0.5, 0.3, 0.15, 0.05)]


# ------------------------------------------------------------------ single transforms


def test_plain_softmax_and_temperature():
    assert_probs(probs_of([1.0, 2.0, 3.0], SamplingSpec()), softmax([1.0, 2.0, 3.0]))
    assert_probs(
        probs_of([1.0, 2.0, 3.0], SamplingSpec(temperature=2.0)), softmax([0.5, 1.0, 1.5])
    )


def test_greedy_is_one_hot_and_eps_threshold():
    spec = SamplingSpec(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9)
    assert spec.is_greedy
    assert torch.equal(probs_of([0.1, 2.0, 1.9], spec), torch.tensor([0.0, 1.0, 0.0]))
    # vLLM's _SAMPLING_EPS: below 1e-5 is greedy, at 1e-5 it samples.
    assert SamplingSpec(temperature=9e-6).is_greedy
    assert not SamplingSpec(temperature=1e-5).is_greedy
    # argmax ties go to the lowest token id.
    assert torch.equal(
        probs_of([3.0, 1.0, 3.0], SamplingSpec(temperature=0.0)),
        torch.tensor([1.0, 0.0, 0.0]),
    )


def test_top_k_keeps_k_and_boundary_ties():
    assert_probs(
        probs_of([1.0, 2.0, 3.0, 0.0], SamplingSpec(top_k=2)),
        softmax([-math.inf, 2.0, 3.0, -math.inf]),
    )
    # vLLM masks logits < k-th largest: equal logits at the boundary all survive.
    assert_probs(
        probs_of([3.0, 3.0, 1.0], SamplingSpec(top_k=1)), torch.tensor([0.5, 0.5, 0.0])
    )
    # top_k <= 0 or >= V is off.
    for k in (0, -1, 3, 10):
        assert_probs(probs_of([1.0, 2.0, 3.0], SamplingSpec(top_k=k)), softmax([1.0, 2.0, 3.0]))


def test_top_p():
    # Ascending probs [.05, .15, .3, .5], cumsum [.05, .2, .5, 1]; masked <= 1 - p.
    assert_probs(
        probs_of(LOG4, SamplingSpec(top_p=0.75)), torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0, 0])
    )
    assert_probs(
        probs_of(LOG4, SamplingSpec(top_p=0.9)),
        torch.tensor([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),
    )
    # A tiny top_p still keeps the most likely token.
    assert_probs(probs_of(LOG4, SamplingSpec(top_p=1e-3)), torch.tensor([1.0, 0, 0, 0]))


def test_min_p():
    # threshold = 0.2 * 0.5 = 0.1: only the 0.05 token goes.
    assert_probs(
        probs_of(LOG4, SamplingSpec(min_p=0.2)),
        torch.tensor([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),
    )


def test_repetition_penalty_uses_prompt_and_output():
    # token 0 in the prompt (positive: divided), token 1 in the output (negative:
    # multiplied), tokens 2, 3 unseen.
    spec = SamplingSpec(repetition_penalty=2.0)
    got = probs_of([2.0, -2.0, 1.0, 0.5], spec, prompt=[0], output=[1])
    assert_probs(got, softmax([1.0, -4.0, 1.0, 0.5]))


def test_presence_and_frequency_use_output_only():
    spec = SamplingSpec(presence_penalty=1.0, frequency_penalty=0.5)
    # token 0 only in the prompt: untouched. token 2 twice, token 3 once in the output.
    got = probs_of([1.0, 1.0, 1.0, 1.0], spec, prompt=[0, 0], output=[2, 2, 3])
    assert_probs(got, softmax([1.0, 1.0, 1.0 - 1.0 - 2 * 0.5, 1.0 - 1.0 - 0.5]))


def test_logit_bias():
    spec = SamplingSpec(logit_bias=((1, 2.0), (2, -1.0)))
    assert_probs(probs_of([0.0, 0.0, 0.0], spec), softmax([0.0, 2.0, -1.0]))
    with pytest.raises(ValueError):
        SamplingSpec(logit_bias=((1, 2.0), (1, 1.0)))
    with pytest.raises(ValueError):
        probs_of([0.0, 0.0], SamplingSpec(logit_bias=((5, 1.0),)))


# ------------------------------------------------------------------ order of operations


def test_order_repetition_before_frequency_presence():
    # rep first: 2 / 2 - 1 = 0; the other order would give (2 - 1) / 2 = 0.5.
    spec = SamplingSpec(repetition_penalty=2.0, frequency_penalty=1.0)
    got = probs_of([2.0, 0.0], spec, output=[0])
    assert_probs(got, torch.tensor([0.5, 0.5]))


def test_order_logit_bias_before_penalties():
    # (1 + 3) / 2 = 2 for token 0 (in prompt); bias after the penalty would give 3.5.
    spec = SamplingSpec(logit_bias=((0, 3.0),), repetition_penalty=2.0)
    assert_probs(probs_of([1.0, 0.0], spec, prompt=[0]), softmax([2.0, 0.0]))


def test_order_greedy_sees_bias_and_penalties():
    greedy = dict(temperature=0.0)
    assert int(probs_of([1.0, 0.0], SamplingSpec(**greedy)).argmax()) == 0
    assert int(probs_of([1.0, 0.0], SamplingSpec(logit_bias=((1, 2.0),), **greedy)).argmax()) == 1
    spec = SamplingSpec(repetition_penalty=4.0, **greedy)
    assert int(probs_of([1.0, 0.5], spec, output=[0]).argmax()) == 1
    spec = SamplingSpec(presence_penalty=1.0, **greedy)
    assert int(probs_of([1.0, 0.5], spec, output=[0]).argmax()) == 1


def test_order_min_p_after_temperature():
    # At T=2 probs are proportional to sqrt(p): [.379, .294, .208, .120] of max .379.
    # min_p=0.5 keeps tokens >= .189: three survive. min_p before temperature
    # (threshold .25 on p) would keep only two.
    got = probs_of(LOG4, SamplingSpec(temperature=2.0, min_p=0.5))
    root = torch.tensor([0.5, 0.3, 0.15, 0.0]).sqrt()
    assert_probs(got, root / root.sum())


def test_order_top_p_after_top_k():
    # top_k=2 leaves [.4, .3] -> renormalised [.571, .429]; top_p=0.5 then masks
    # .429 (<= 0.5). top-p first would have kept {0, 1}.
    logits = [math.log(x) for x in (0.4, 0.3, 0.2, 0.1)]
    got = probs_of(logits, SamplingSpec(top_k=2, top_p=0.5))
    assert_probs(got, torch.tensor([1.0, 0, 0, 0]))


def test_order_penalties_before_temperature_and_top_k():
    # The frequency penalty moves token 0 below token 1 before top_k=1 picks.
    spec = SamplingSpec(temperature=0.5, top_k=1, frequency_penalty=1.0)
    assert_probs(probs_of([1.0, 0.5, 0.0], spec, output=[0]), torch.tensor([0.0, 1.0, 0.0]))


# ------------------------------------------------------------------ histories


def test_history_tensor_form_matches_lists():
    torch.manual_seed(0)
    vocab = 20
    logits = torch.randn(3, vocab)
    specs = [SamplingSpec(repetition_penalty=1.5, presence_penalty=0.3, frequency_penalty=0.2)] * 3
    prompts = [[1, 2, 3], [4], []]
    outputs = [[5, 5], [], [1, 19, 19, 19]]
    by_list = target_probs(logits, specs, prompts, outputs)
    pad = -1  # any id outside [0, V) is padding
    prompt_t = torch.tensor([[1, 2, 3], [4, pad, pad], [pad, pad, pad]])
    output_t = torch.tensor([[5, 5, pad, pad], [pad] * 4, [1, 19, 19, 19]])
    assert torch.equal(by_list, target_probs(logits, specs, prompt_t, output_t))


def test_expand_histories_includes_earlier_drafts():
    got = expand_histories([[7, 8], []], [[1, 2, 3], []])
    assert got == [
        [[7, 8], [7, 8, 1], [7, 8, 1, 2], [7, 8, 1, 2, 3]],
        [[]],
    ]


def test_position_probs_penalise_earlier_drafts():
    vocab, num_pos = 6, 4
    logits = torch.zeros(num_pos, vocab)
    spec = SamplingSpec(frequency_penalty=1.0)
    got = position_probs(logits, [spec], [[]], [[5]], [[1, 2, 1]]).unsqueeze(0)
    # Position j sees output [5] plus drafts[:j].
    expected_penalty = [
        [0, 0, 0, 0, 0, 1],
        [0, 1, 0, 0, 0, 1],
        [0, 1, 1, 0, 0, 1],
        [0, 2, 1, 0, 0, 1],
    ]
    for j in range(num_pos):
        assert_probs(got[0, j], softmax([-float(x) for x in expected_penalty[j]]))


def test_position_probs_match_target_probs_on_expanded_histories():
    torch.manual_seed(1)
    vocab = 30
    specs = [
        SamplingSpec(temperature=0.8, top_k=10, repetition_penalty=1.3, presence_penalty=0.4),
        SamplingSpec(temperature=0.0, frequency_penalty=2.0),
        SamplingSpec(top_p=0.7, min_p=0.05, frequency_penalty=0.5, logit_bias=((3, 1.0),)),
        SamplingSpec(temperature=0.9),
    ]
    prompts = [[0, 1, 2], [3, 3], [29], [5]]
    outputs = [[4, 5], [], [6, 6, 7], [8]]
    drafts = [[8, 9, 8], [10], [], [1, 2]]
    logits = torch.randn(sum(len(d) + 1 for d in drafts), vocab)     # flat [T, V]
    got = position_probs(logits, specs, prompts, outputs, drafts)

    histories = expand_histories(outputs, drafts)
    row = 0
    for b in range(len(specs)):
        for j in range(len(drafts[b]) + 1):
            want = target_probs(logits[row : row + 1], [specs[b]], [prompts[b]], [histories[b][j]])
            if specs[b].is_greedy:  # processed logits: only the argmax is promised
                assert int(got[row].argmax()) == int(want[0].argmax()), (b, j)
            else:
                assert torch.equal(got[row], want[0]), (b, j)
            row += 1


# ------------------------------------------------------------------ batch and params


def test_rows_are_independent_of_batch_neighbours():
    torch.manual_seed(2)
    vocab = 40
    specs = [
        SamplingSpec(temperature=0.0),
        SamplingSpec(temperature=0.7, top_k=5),
        SamplingSpec(top_p=0.8, repetition_penalty=1.2),
        SamplingSpec(min_p=0.1, presence_penalty=0.5),
    ]
    logits = torch.randn(4, vocab) * 2
    prompts = [[1], [2, 3], [], [4]]
    outputs = [[5], [], [6, 6], [7]]
    batched = target_probs(logits, specs, prompts, outputs)
    for b in range(4):
        one = slice(b, b + 1)
        alone = target_probs(logits[one], specs[one], prompts[one], outputs[one])
        assert torch.equal(batched[b], alone[0])
    assert torch.allclose(batched.sum(-1), torch.ones(4))


def test_from_sampling_params_duck_types():
    sp = types.SimpleNamespace(
        temperature=0.7,
        top_k=-1,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.2,
        frequency_penalty=0.3,
        logit_bias={5: 1.0, 2: -2.0},
        seed=42,
    )
    spec = SamplingSpec.from_sampling_params(sp)
    assert spec == SamplingSpec(0.7, -1, 0.9, 0.05, 1.1, 0.2, 0.3, ((2, -2.0), (5, 1.0)), 42)
    assert not spec.is_greedy
    gen = make_generator(spec)
    same = torch.Generator().manual_seed(42)
    assert torch.equal(torch.rand(3, generator=gen), torch.rand(3, generator=same))
    assert make_generator(SamplingSpec()) is None
    with pytest.raises(ValueError):
        SamplingSpec(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingSpec(temperature=-1.0)


# ------------------------------------------------------------------ differential vs vLLM


def test_matches_vllm_sampler_bit_for_bit():
    """The full chain equals vLLM 0.32's `Sampler` (CPU path), ties included, for
    float32 and bf16 model logits; penalties go through vLLM's own op on both sides.

    Runs vLLM's own `Sampler.apply_logits_processors` and `Sampler.sample` with its
    logit-bias and min-p processors; the final top-k/top-p sampler is swapped for a
    probe that applies vLLM's `apply_top_k_top_p` and records the softmax instead of
    sampling. Skipped when vLLM is not installed.
    """
    pytest.importorskip("vllm")
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
    )
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    gen = torch.Generator().manual_seed(3)
    batch, vocab = 24, 50
    params = [
        SamplingParams(
            temperature=[0.0, 0.7, 1.0, 1.3][b % 4],
            top_k=[0, 5, -1, 10][(b // 2) % 4],
            top_p=[1.0, 0.8, 0.5][b % 3],
            min_p=[0.0, 0.05, 0.2][(b // 3) % 3],
            repetition_penalty=[1.0, 1.3, 0.8][b % 3],
            presence_penalty=[0.0, 0.5, -0.3][(b + 1) % 3],
            frequency_penalty=[0.0, 0.2, 0.7][(b + 2) % 3],
            logit_bias={3: 2.0, 7: -1.5} if b % 2 else None,
        )
        for b in range(batch)
    ]
    prompts = [torch.randint(0, vocab, (1 + b % 7,), generator=gen).tolist() for b in range(batch)]
    outputs = [torch.randint(0, vocab, (b % 9,), generator=gen).tolist() for b in range(batch)]
    specs = [SamplingSpec.from_sampling_params(p) for p in params]

    minp = MinPLogitsProcessor(
        types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=batch)),
        "cpu",
        False,
    )
    bias = LogitBiasLogitsProcessor(None, "cpu", False)
    update = types.SimpleNamespace(
        added=[(i, p, prompts[i], outputs[i]) for i, p in enumerate(params)],
        removed=[],
        moved=[],
        batch_size=batch,
    )
    minp.update_state(update)
    bias.update_state(update)
    prompt_t = torch.full((batch, max(map(len, prompts))), vocab, dtype=torch.long)
    for i, p in enumerate(prompts):
        prompt_t[i, : len(p)] = torch.tensor(p)
    metadata = SamplingMetadata(
        temperature=torch.tensor([0.0 if s.is_greedy else s.temperature for s in specs]),
        all_greedy=False,
        all_random=False,
        top_p=torch.tensor([s.top_p for s in specs]),
        top_k=torch.tensor(
            [s.top_k if 0 < s.top_k < vocab else vocab for s in specs], dtype=torch.int32
        ),
        generators={},
        max_num_logprobs=None,
        no_penalties=False,
        prompt_token_ids=prompt_t,
        frequency_penalties=torch.tensor([s.frequency_penalty for s in specs]),
        presence_penalties=torch.tensor([s.presence_penalty for s in specs]),
        repetition_penalties=torch.tensor([s.repetition_penalty for s in specs]),
        output_token_ids=outputs,
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors([minp, bias]),
    )
    sampler = Sampler()
    recorded = {}

    def probe(logits, generators, k, p):
        recorded["probs"] = apply_top_k_top_p(logits, k, p).softmax(-1, dtype=torch.float32)
        return torch.zeros(logits.shape[0], dtype=torch.long), None

    sampler.topk_topp_sampler.forward = probe

    # bf16: a bf16 model's logits, widened to float32 as vLLM's Sampler.forward and
    # our rejection sampler both do first (penalties then run on float32 in both).
    for name, logits in [
        ("continuous", torch.randn(batch, vocab, generator=gen) * 3),
        ("tied", torch.randint(-3, 4, (batch, vocab), generator=gen).float()),
        ("bf16", (torch.randn(batch, vocab, generator=gen) * 3).bfloat16().float()),
    ]:
        processed = sampler.apply_logits_processors(logits.clone(), metadata, False)
        sampled, _ = sampler.sample(processed, metadata)
        ours = target_probs(logits, specs, prompts, outputs)
        for b, spec in enumerate(specs):
            if spec.is_greedy:
                assert int(ours[b].argmax()) == int(sampled[b]) and float(ours[b].max()) == 1.0
            else:
                assert torch.equal(ours[b], recorded["probs"][b]), (name, b)

    # Draft positions: vLLM's rejection sampler builds per-position histories the
    # same way (one row per draft position, rows without drafts skipped).
    outs, drafts = [[1, 2], [3], [4]], [[5, 6, 7], [], [8]]
    flat = RejectionSampler._combine_outputs_with_spec_tokens(outs, drafts)
    ours_flat = [h for hs, d in zip(expand_histories(outs, drafts), drafts) for h in hs[: len(d)]]
    assert flat == ours_flat
