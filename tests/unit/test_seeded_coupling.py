"""Seeded sampled rows: the token each output position emits is fixed by the request's
own noise (rejection.py docstring; token_draw.py; compat/seeded.py).

Two noise sources. On CPU, vLLM's: output token i is vLLM's fused Gumbel-max
(``torch.ops._C.fused_gumbel_argmax``) of the processed logits with the i-th seed of
the request's generator stream (``SeedStream``), so the text is vLLM's own without
speculation. Where that op is missing, the fallback: the token at absolute position t
is y_t = first_argmax(p_t / E_t), E_t = position_noise(seed, t) (the exponential race).
Either way it must not depend on what was drafted, how many drafts a step had or who
shared the batch. Checked here on a Markov-chain "model" (p_t = P[token at t-1], so
drafts change the p rows a step verifies, as in a real model), against plain
sequential decoding: the race's, and vLLM's own sampler step for the stream. Both
noises are checked to sample p (chi-squared, with negative controls) and to be
independent across consecutive tokens; the race's noise to be positive and distinct
per (seed, t); the stream to replay vLLM's generator draws; and the draft sampler to
draft with the noise verification uses for the same output token.

Statistics as in test_rejection_math.py: each check at ALPHA = 1e-3 / MAX_CHECKS
(Bonferroni over this module), fixed seeds, so outcomes are deterministic.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from test_rejection_math import chi2_pvalue, random_dist
from vllm_specdec_plugin.compat import seeded as compat_seeded
from vllm_specdec_plugin.compat.seeded import seeded_tokens
from vllm_specdec_plugin.draft.sampler import DraftSampler
from vllm_specdec_plugin.rejection import PLACEHOLDER_TOKEN_ID, rejection_sample
from specdec_testing.rejection_reference import rejection_sample_reference
from vllm_specdec_plugin.sampling.pipeline import SamplingSpec, target_probs
from vllm_specdec_plugin.token_draw import (SeedStream, SeedStreams, coupled_token,
                                            first_argmax, noise_seed, position_noise,
                                            position_noise_rows)

pytestmark = pytest.mark.unit

MAX_CHECKS = 24
ALPHA = 1e-3 / MAX_CHECKS
Z = float(torch.special.ndtri(torch.tensor(1 - ALPHA / 2, dtype=torch.float64)))


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def race(p_row: torch.Tensor, seed: int, t: int) -> int:
    return int(coupled_token(p_row, position_noise(seed, t, p_row.shape[-1])))


def vllm_op():
    """vLLM's CPU sampling op, or a clean skip where this vLLM has none."""
    try:
        import vllm._custom_ops  # noqa: F401 - registers torch.ops._C on CPU builds

        return torch.ops._C.fused_gumbel_argmax
    except (ImportError, AttributeError, RuntimeError) as e:
        pytest.skip(f"vLLM's fused_gumbel_argmax op is not available here: {e!r}")


def vllm_seeds(seed: int, n: int) -> list[int]:
    """What vLLM's forward_cpu draws for a seeded request's first n output tokens: one
    ``torch.randint(0, 2**31, (1,), generator=gen, dtype=torch.long)`` per token from a
    generator seeded with the request's seed (gpu_model_runner: manual_seed(seed))."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    return [int(torch.randint(0, 2**31, (1,), generator=gen, dtype=torch.long).item())
            for _ in range(n)]


def log_probs(p: torch.Tensor) -> torch.Tensor:
    """float32 logits whose softmax is p (p = 0: -inf, as after top-k/top-p)."""
    return torch.log(p.double()).float()


# ------------------------------------------------------------------ the noise


def test_noise_is_positive_finite_and_keyed_by_seed_and_position():
    e = torch.stack([position_noise(s, t, 4096) for s in range(5) for t in range(40)])
    assert e.dtype == torch.float32 and bool((e > 0).all()) and bool(e.isfinite().all())
    assert abs(float(e.double().mean()) - 1.0) < 0.01            # Exp(1): mean 1
    assert torch.equal(position_noise(3, 17, 64), position_noise(3, 17, 64))
    firsts = {tuple(r[:4].tolist()) for r in e}
    assert len(firsts) == e.shape[0]                             # no two (seed, t) alike
    assert torch.equal(position_noise_rows(3, 10, 4, 64),
                       torch.stack([position_noise(3, t, 64) for t in range(10, 14)]))


def test_noise_seeds_distinct_in_the_32_bits_cpu_generators_keep():
    """mt19937 keeps only the low 32 bits of a seed: those are a bijection of t."""
    for seed in (0, 1, -1, 2**63 + 5, 123456789):
        lows = {noise_seed(seed, t) & 0xFFFFFFFF for t in range(50_000)}
        assert len(lows) == 50_000
        assert all(0 <= noise_seed(seed, t) < 2**64 for t in (0, 1, 2**31))
    assert len({noise_seed(s, 7) for s in range(10_000)}) == 10_000


def test_zero_noise_is_clamped_and_zero_probability_never_wins(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "exponential_", lambda self, **kw: self.zero_())
    e = position_noise(1, 2, 8)
    assert bool((e == torch.finfo(torch.float32).tiny).all())
    p = torch.tensor([0.0, 0.0, 1e-30, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert int(coupled_token(p, e)) == 2
    assert int(coupled_token(torch.tensor([0.0, 1e-38] + [0.0] * 6), e)) == 1
    assert int(coupled_token(torch.tensor([0.0] * 7 + [1.0]), e)) == 7


# ------------------------------------------------------------------ the race samples p


def _race_samples(p, n, seed_major=True):
    """n races on p: over seeds at one position, or over positions of one seed."""
    if seed_major:
        return torch.tensor([race(p, 10_000 + i, 33) for i in range(n)])
    return torch.tensor([race(p, 4321, i) for i in range(n)])


RACE_CASES = [("V2", 2, 1.0, 0.0, 40_000), ("V5 zeros", 5, 1.5, 0.4, 40_000),
              ("V64 peaked", 64, 3.0, 0.0, 40_000), ("V1000", 1000, 1.0, 0.2, 30_000)]


@pytest.mark.parametrize("case", RACE_CASES, ids=lambda c: c[0])
def test_race_distribution_is_p(case):
    name, vocab, scale, zero_frac, n = case
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    p = random_dist(gen, vocab, scale=scale, zero_frac=zero_frac)
    over_seeds = _race_samples(p, n, seed_major=True)
    over_positions = _race_samples(p, n, seed_major=False)
    assert chi2_pvalue(over_seeds, p) > ALPHA, name
    assert chi2_pvalue(over_positions, p) > ALPHA, name


def test_race_negative_controls_fail():
    gen = torch.Generator().manual_seed(99)
    p = random_dist(gen, 16, scale=1.5)
    samples = _race_samples(p, 40_000)
    # The same samples against a p moved by TV 0.04 toward its likeliest token.
    moved = p * 0.96
    moved[int(p.argmax())] += 0.04
    assert chi2_pvalue(samples, moved) < ALPHA
    # A broken race (uniform instead of exponential noise) does not sample p.
    broken = torch.tensor([int(first_argmax(
        p / torch.rand(16, generator=torch.Generator().manual_seed(noise_seed(i, 0)))))
        for i in range(40_000)])
    assert chi2_pvalue(broken, p) < ALPHA


def test_consecutive_positions_are_independent():
    """The joint of (y_t, y_t+1) on a chain is P's: E_t and E_t+1 do not correlate."""
    vocab, n = 4, 40_000
    gen = torch.Generator().manual_seed(3)
    P = torch.stack([random_dist(gen, vocab, scale=1.5) for _ in range(vocab)])
    cells = []
    for i in range(n):
        a = race(P[0], 500 + i, 20)
        cells.append(a * vocab + race(P[a], 500 + i, 21))
    joint = (P[0].double().unsqueeze(1) * P.double()).reshape(-1)
    assert chi2_pvalue(torch.tensor(cells), joint) > ALPHA
    # Negative control: reusing E_t at t+1 correlates them; the joint check sees it.
    bad = [race(P[0], 500 + i, 20) for i in range(n)]
    bad = [a * vocab + race(P[a], 500 + i, 20) for i, a in enumerate(bad)]
    assert chi2_pvalue(torch.tensor(bad), joint) < ALPHA


def test_coupled_draft_acceptance_is_at_least_the_bound():
    """P(argmax(p/E) == argmax(q/E)) >= (1 - TV) / (1 + TV) (and below 1 - TV here)."""
    gen = torch.Generator().manual_seed(11)
    p, q = random_dist(gen, 30, scale=1.5), random_dist(gen, 30, scale=1.5)
    tv = float((p - q).abs().sum()) / 2
    n = 20_000
    agree = 0
    for i in range(n):
        e = position_noise(i, 5, 30)
        agree += int(coupled_token(p, e) == coupled_token(q, e))
    bound = (1 - tv) / (1 + tv)
    slack = Z * math.sqrt(bound * (1 - bound) / n)
    assert agree / n >= bound - slack, (agree / n, bound)
    assert agree / n <= 1 - tv + Z * math.sqrt(tv * (1 - tv) / n)


# ------------------------------------------------------------------ vLLM's stream and op


def test_seed_stream_replays_vllms_generator_draws():
    """Output token i's seed is the i-th randint of a generator seeded with the
    request's seed, asked for in any windows, overlapping or skipping ahead."""
    for seed in (0, 7, 2**31 - 1, 123456789, 2**40 + 3):
        want = vllm_seeds(seed, 12)
        assert SeedStream(seed, 5).seeds(0, 12) == want
        s = SeedStream(seed, 5)
        assert s.seeds(0, 3) == want[0:3]
        assert s.seeds(2, 4) == want[2:6]
        assert s.seeds(5, 1) == want[5:6]
        assert s.seeds(8, 2) == want[8:10]          # skipping ahead draws those between
        assert s.seeds(6, 4) == want[6:10]
    # A draft round asks one token a pass, ahead of the verification that follows at the
    # round's first output index: that verification must still get its seeds.
    s, want = SeedStream(3, 0), vllm_seeds(3, 20)
    for j in range(5):
        assert s.seeds(4 + j, 1) == [want[4 + j]]
    assert s.seeds(4, 6) == want[4:10]
    s.release(6)                                    # output tokens 0..5 emitted
    assert s.seeds(6, 3) == want[6:9] and s.seeds(9, 2) == want[9:11]
    with pytest.raises(ValueError, match="released"):
        s.seeds(5, 1)
    s.release(15)                                   # past what was drawn: still aligned
    assert s.seeds(15, 3) == want[15:18]
    # The request's own generator: torch's default one is neither read nor advanced.
    torch.manual_seed(0)
    SeedStream(3, 0).seeds(0, 8)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))
    # One stream per live request id, fresh after it is forgotten.
    streams = SeedStreams()
    a = streams.get("a", 3, 0)
    assert streams.get("a", 3, 0) is a and streams.get("b", 3, 0) is not a
    a.seeds(0, 4)
    a.release(4)
    streams.forget("a")
    assert streams.get("a", 3, 0).seeds(0, 2) == want[:2]


def test_state_at_sets_a_generator_to_draw_that_tokens_seed():
    """A step without drafts lets vLLM's sampler draw a seeded row's seed from vLLM's
    generator, set to ``state_at(next output index)``: the draw is the stream's seed
    there, whether the stream has drawn ahead (a draft round) or not yet."""
    s, want = SeedStream(11, 4), vllm_seeds(11, 12)
    gen = torch.Generator()

    def vllm_draw(index: int) -> int:
        gen.set_state(s.state_at(index))
        return int(torch.randint(0, 2**31, (1,), generator=gen, dtype=torch.long).item())

    assert [vllm_draw(i) for i in range(3)] == want[:3]   # nothing drawn ahead
    s.seeds(3, 6)                                          # a draft round drew 3..8
    s.release(4)
    assert vllm_draw(4) == want[4] and vllm_draw(5) == want[5]
    assert vllm_draw(10) == want[10]                       # past what was drawn
    with pytest.raises(ValueError, match="released"):
        s.state_at(3)


@pytest.mark.parametrize("vocab", [5, 300])
def test_seeded_tokens_are_vllms_op_on_the_streams_seeds(vocab):
    op = vllm_op()
    g = torch.Generator().manual_seed(vocab)
    for it in range(24):
        n = 1 + it % 9
        logits = torch.randn(n, vocab, generator=g) * 3
        logits[torch.rand(n, vocab, generator=g) < 0.3] = -math.inf   # cut by top-k/top-p
        logits[:, it % vocab] = 0.5                                    # one kept per row
        seed, start = 1000 + it, it % 4
        got = seeded_tokens(logits, SeedStream(seed, 17), start)
        seeds = torch.tensor(vllm_seeds(seed, start + n)[start:], dtype=torch.long)
        assert torch.equal(got, op(logits.contiguous(), seeds)), it
        assert bool(logits.gather(1, got.unsqueeze(1)).isfinite().all())   # never a cut token


def test_seeded_tokens_fall_back_to_the_race_without_the_op(monkeypatch):
    """Where vLLM has no such op: the race on softmax(logits) with the stream's noise,
    keyed by (seed, absolute position prompt_len + output index)."""
    monkeypatch.setattr(compat_seeded, "_op", False)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 50, generator=g) * 2
    probs = torch.softmax(logits, dim=-1)
    got = seeded_tokens(logits, SeedStream(9, 30), 4)
    assert got.tolist() == [race(probs[i], 9, 34 + i) for i in range(6)]


OP_CASES = [c for c in RACE_CASES if c[0] in ("V5 zeros", "V64 peaked")]


@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c[0])
def test_vllm_noise_samples_softmax_of_the_logits(case):
    """Over seeds at one output index, and over the output indices of one stream."""
    vllm_op()
    name, vocab, scale, zero_frac, n = case
    gen = torch.Generator().manual_seed(sum(map(ord, name)) + 1)
    logits = log_probs(random_dist(gen, vocab, scale=scale, zero_frac=zero_frac))
    p = torch.softmax(logits.double(), dim=-1)
    over_seeds = torch.cat([seeded_tokens(logits[None], SeedStream(10_000 + i, 0), 0)
                            for i in range(n)])
    over_tokens = seeded_tokens(logits.expand(n, vocab).contiguous(), SeedStream(4321, 0), 0)
    assert chi2_pvalue(over_seeds, p) > ALPHA, name
    assert chi2_pvalue(over_tokens, p) > ALPHA, name


def test_vllm_noise_negative_controls_fail():
    vllm_op()
    gen = torch.Generator().manual_seed(99)
    p = random_dist(gen, 16, scale=1.5)
    n = 40_000
    samples = seeded_tokens(log_probs(p).expand(n, 16).contiguous(), SeedStream(77, 0), 0)
    # The same samples against a p moved by TV 0.04 toward its likeliest token.
    moved = p * 0.96
    moved[int(p.argmax())] += 0.04
    assert chi2_pvalue(samples, moved) < ALPHA
    # Probabilities handed to the op as if they were logits do not sample p.
    wrong = seeded_tokens(p.expand(n, 16).contiguous(), SeedStream(77, 0), 0)
    assert chi2_pvalue(wrong, p) < ALPHA


def test_vllm_noise_consecutive_tokens_are_independent():
    """The joint of (y_0, y_1) on a chain is P's: consecutive seeds do not correlate."""
    vllm_op()
    vocab, n = 4, 40_000
    gen = torch.Generator().manual_seed(3)
    P = torch.stack([random_dist(gen, vocab, scale=1.5) for _ in range(vocab)])
    L = log_probs(P)
    joint = (P[0].double().unsqueeze(1) * P.double()).reshape(-1)
    good, bad = [], []
    for i in range(n):
        s = SeedStream(500 + i, 20)
        a = int(seeded_tokens(L[0:1], s, 0)[0])
        good.append(a * vocab + int(seeded_tokens(L[a:a + 1], s, 1)[0]))
        # Negative control: token 1 on token 0's seed (the stream not advanced).
        bad.append(a * vocab + int(seeded_tokens(L[a:a + 1], s, 0)[0]))
    assert chi2_pvalue(torch.tensor(good), joint) > ALPHA
    assert chi2_pvalue(torch.tensor(bad), joint) < ALPHA


def test_vllm_noise_draft_acceptance_is_at_least_the_bound():
    """Gumbel-max on one seed under q and p agrees with probability >= (1 - TV) / (1 + TV)
    (and below 1 - TV here), as the race does."""
    op = vllm_op()
    gen = torch.Generator().manual_seed(11)
    p, q = random_dist(gen, 30, scale=1.5), random_dist(gen, 30, scale=1.5)
    tv = float((p - q).abs().sum()) / 2
    n = 20_000
    seeds = torch.tensor(vllm_seeds(31, n), dtype=torch.long)
    on_p = op(log_probs(p).expand(n, 30).contiguous(), seeds)
    on_q = op(log_probs(q).expand(n, 30).contiguous(), seeds)
    rate = float((on_p == on_q).double().mean())
    bound = (1 - tv) / (1 + tv)
    assert rate >= bound - Z * math.sqrt(bound * (1 - bound) / n), (rate, bound)
    assert rate <= 1 - tv + Z * math.sqrt(tv * (1 - tv) / n)


# ------------------------------------------------------------------ drafts never matter


VOCAB = 40


class Chain:
    """A Markov-chain "model": P[prev] the target's next-token distribution, Q[prev] the
    draft's (right about half the time); LP, LQ their logits (log: -inf where 0)."""

    def __init__(self, seed):
        gen = torch.Generator().manual_seed(seed)
        self.P = torch.stack([random_dist(gen, VOCAB, scale=2.5, zero_frac=0.3)
                              for _ in range(VOCAB)])
        Q = torch.stack([random_dist(gen, VOCAB, scale=2.5) for _ in range(VOCAB)])
        self.Q = 0.5 * Q + 0.5 * self.P
        self.LP, self.LQ = log_probs(self.P), log_probs(self.Q)


class Race:
    """The fallback noise, as its caller draws y: the race on probabilities p_t, keyed by
    (seed, t), t = t0 + the output index."""

    def __init__(self, chain, seed, t0):
        self.chain, self.seed, self.t0 = chain, seed, t0

    def p_rows(self, ctx):
        return self.chain.P[ctx]

    def draft_token(self, prev, index):      # the draft sampler's rule, on q
        return race(self.chain.Q[prev], self.seed, self.t0 + index)

    def target_token(self, prev, index):
        return race(self.chain.P[prev], self.seed, self.t0 + index)

    def verify(self, p_rows, start):
        return torch.tensor([race(p_rows[j], self.seed, self.t0 + start + j)
                             for j in range(p_rows.shape[0])])


class Stream:
    """vLLM's noise, as compat/rejection_adapter draws y: p rows are processed logits,
    y = seeded_tokens(p rows, the request's SeedStream, output index), after releasing
    the emitted tokens' seeds. The draft's passes read the same stream, one token a
    pass, ahead of the verification (draft/sampler.py)."""

    def __init__(self, chain, seed, t0):
        self.chain, self.stream = chain, SeedStream(seed, t0)

    def p_rows(self, ctx):
        return self.chain.LP[ctx]

    def draft_token(self, prev, index):
        return int(seeded_tokens(self.chain.LQ[prev:prev + 1], self.stream, index)[0])

    def target_token(self, prev, index):
        return int(seeded_tokens(self.chain.LP[prev:prev + 1], self.stream, index)[0])

    def verify(self, p_rows, start):
        self.stream.release(start)
        return seeded_tokens(p_rows, self.stream, start)


NOISES = [Race, Stream]


def needs(noise):
    if noise is Stream:
        vllm_op()                            # skips where vLLM has no such op


def sequential(noise, chain, seed, t0, length):
    """No speculation, one token at a time from context 0: the race's y_t =
    race(P[y_{t-1}], seed, t); for the stream, vLLM's own sampler step
    (TopKTopPSampler.forward_cpu): the op on log P[prev] with the next randint of a
    generator seeded with the seed."""
    out, prev = [], 0
    if noise is Race:
        for t in range(t0, t0 + length):
            prev = race(chain.P[prev], seed, t)
            out.append(prev)
        return out
    op = vllm_op()
    gen = torch.Generator()
    gen.manual_seed(seed)
    for _ in range(length):
        s = torch.randint(0, 2**31, (1,), generator=gen, dtype=torch.long).item()
        prev = int(op(chain.LP[prev:prev + 1].contiguous(), torch.tensor([s]))[0])
        out.append(prev)
    return out


def _drafts(kind, noise, prev, start, k, rng, history):
    """(k draft ids, q rows [k, V] or None) of one step from output index ``start``."""
    Q = noise.chain.Q
    if kind == "random":
        return [rng.randrange(VOCAB) for _ in range(k)], torch.stack([Q[0]] * k) if k else None
    if kind == "invalid":
        x = [rng.randrange(VOCAB) for _ in range(k)]
        if k:
            x[rng.randrange(k)] = VOCAB + 3
        return x, None
    if kind == "oracle":     # drafts equal to y: all accepted
        x, ctx = [], prev
        for j in range(k):
            ctx = noise.target_token(ctx, start + j)
            x.append(ctx)
        return x, None
    if kind == "ngram":      # point masses: the last k tokens again
        return (history[-k:] + [1] * k)[:k] if k else [], None
    if kind == "coupled":    # the draft sampler's rule: q on the same noise
        x, ctx, rows = [], prev, []
        for j in range(k):
            rows.append(Q[ctx])
            ctx = noise.draft_token(ctx, start + j)
            x.append(ctx)
        return x, torch.stack(rows) if k else None
    if kind == "sampled":    # unseeded-style drafts from q, with q handed over
        x, ctx, rows = [], prev, []
        for j in range(k):
            rows.append(Q[ctx])
            ctx = int(torch.multinomial(Q[ctx], 1))
            x.append(ctx)
        return x, torch.stack(rows) if k else None
    raise ValueError(kind)


def _neighbours(rng, gen, n, k_max):
    """Random neighbour rows: (drafts, p rows, q rows, greedy, seeded, y) each; a seeded
    neighbour's y is the race on its own seed and t0."""
    rows = []
    for _ in range(n):
        k = rng.randrange(k_max + 1)
        p = torch.stack([random_dist(gen, VOCAB) for _ in range(k + 1)])
        q = torch.stack([random_dist(gen, VOCAB) for _ in range(k)]) if k else None
        drafts = [int(torch.multinomial(q[j], 1, generator=gen)) for j in range(k)]
        greedy = rng.random() < 0.3
        seed = None if rng.random() < 0.5 else rng.randrange(1000)
        t0 = rng.randrange(500)
        seeded = seed is not None and not greedy
        y = (torch.tensor([race(p[j], seed, t0 + j) for j in range(k + 1)]) if seeded
             else torch.zeros(k + 1, dtype=torch.long))
        rows.append((drafts, p, q, greedy, seeded, y))
    return rows


def speculative(noise_kind, chain, seed, t0, length, kind, k_of_step, rng,
                fn=rejection_sample, neighbours=0):
    """Decode ``length`` tokens of one seeded row with drafts of ``kind``, k per step
    from ``k_of_step``, among ``neighbours`` random rows; returns (tokens, drafted,
    accepted)."""
    noise = noise_kind(chain, seed, t0)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    out, prev, drafted, accepted, step = [], 0, 0, 0, 0
    while len(out) < length:
        start = len(out)
        k = k_of_step(step)
        step += 1
        x, q_rows = _drafts(kind, noise, prev, start, k, rng, out)
        drafted += len(x)
        ctx = [prev] + [d if 0 <= d < VOCAB else 0 for d in x]
        p_rows = noise.p_rows(ctx)
        ours = (x, p_rows, q_rows, False, True, noise.verify(p_rows, start))
        rows = _neighbours(rng, gen, neighbours, 8)
        at = rng.randrange(len(rows) + 1)
        rows.insert(at, ours)
        k_max = max(len(r[0]) for r in rows)
        drafts = torch.full((len(rows), k_max), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
        for b, r in enumerate(rows):
            drafts[b, : len(r[0])] = torch.tensor(r[0], dtype=torch.long)
        qs = [r[2] if r[2] is not None else torch.zeros(len(r[0]), VOCAB) for r in rows]
        out_ids, num_acc = fn(drafts, torch.tensor([len(r[0]) for r in rows]),
                              torch.cat(qs), torch.cat([r[1] for r in rows]),
                              torch.tensor([r[3] for r in rows]),
                              [r[4] for r in rows], torch.cat([r[5] for r in rows]))
        tokens = out_ids[at, : int(num_acc[at]) + 1].tolist()
        accepted += int(num_acc[at])
        out += tokens
        prev = tokens[-1]
    return out[:length], drafted, accepted


KINDS = ["random", "invalid", "oracle", "ngram", "coupled", "sampled"]


def test_stream_sequential_is_vllms_sampler_step():
    """The plugin's stream, one token at a time, is vLLM's sampler step on the same
    logits: the reference the speculative runs below are held to."""
    chain = Chain(5)
    for seed in (7, 2**40 + 3):
        want = sequential(Stream, chain, seed, 12, 30)
        s, prev, got = SeedStream(seed, 12), 0, []
        for i in range(30):
            prev = int(seeded_tokens(chain.LP[prev:prev + 1], s, i)[0])
            got.append(prev)
        assert got == want, seed


@pytest.mark.parametrize("noise", NOISES, ids=lambda n: n.__name__.lower())
@pytest.mark.parametrize("kind", KINDS)
def test_seeded_output_identical_for_every_k_and_drafter(noise, kind):
    needs(noise)
    chain = Chain(5)
    for seed, t0 in ((7, 12), (2**40 + 3, 0)):
        want = sequential(noise, chain, seed, t0, 30)
        for k in range(9):
            rng = random.Random(k)
            got, drafted, _ = speculative(noise, chain, seed, t0, 30, kind, lambda s: k, rng,
                                          neighbours=2)
            assert got == want, (kind, seed, k)
            assert (drafted > 0) == (k > 0)
    # A different seed gives a different output (the check above is not vacuous).
    assert sequential(noise, chain, 8, 12, 30) != sequential(noise, chain, 7, 12, 30)


@pytest.mark.parametrize("noise", NOISES, ids=lambda n: n.__name__.lower())
def test_seeded_output_identical_under_changing_schedules_and_neighbours(noise):
    needs(noise)
    chain = Chain(6)
    want = sequential(noise, chain, 99, 40, 40)
    for trial in range(6):
        rng = random.Random(100 + trial)
        schedule = [rng.randrange(9) for _ in range(64)]
        kind = KINDS[trial % len(KINDS)]
        got, _, _ = speculative(noise, chain, 99, 40, 40, kind, lambda s: schedule[s], rng,
                                neighbours=rng.randrange(8))
        assert got == want, (trial, kind)
    ref, _, _ = speculative(noise, chain, 99, 40, 40, "coupled", lambda s: 3, random.Random(1),
                            fn=rejection_sample_reference, neighbours=3)
    assert ref == want


@pytest.mark.parametrize("noise", NOISES, ids=lambda n: n.__name__.lower())
def test_drafts_equal_to_y_always_accepted_coupled_often_random_rarely(noise):
    needs(noise)
    chain = Chain(7)
    rate = {}
    for kind in ("oracle", "coupled", "random"):
        _, drafted, accepted = speculative(noise, chain, 5, 0, 200, kind, lambda s: 4,
                                           random.Random(0))
        rate[kind] = accepted / drafted
    assert rate["oracle"] == 1.0
    # Q is half P. Measured over chains 5 / 7 / 11 (200 tokens, k 4): coupled 0.30 /
    # 0.32 / 0.29 with the race, 0.31 / 0.25 / 0.34 with vLLM's stream; random <= 0.01.
    assert rate["coupled"] > 0.2 > 0.05 > rate["random"], rate


# ------------------------------------------------------------------ fast == reference


@pytest.mark.parametrize("vocab", [7, 300])
def test_fast_matches_reference_on_seeded_rows(vocab):
    """Seeded rows with random y (p rows probabilities or logits: never read for them):
    bit for bit the reference, and by hand the drafts kept while they equal y, then y."""
    gen = torch.Generator().manual_seed(vocab)
    rng = random.Random(vocab)
    kept = stopped = 0
    for it in range(10):
        batch, k = 12, 8
        num_draft = torch.tensor([rng.randrange(k + 1) for _ in range(batch)])
        total = int(num_draft.sum())
        p = torch.stack([random_dist(gen, vocab, scale=2.0, zero_frac=0.2)
                         for _ in range(total + batch)])
        q = torch.stack([random_dist(gen, vocab) for _ in range(total)]) if it % 2 else None
        greedy = torch.tensor([rng.random() < 0.2 for _ in range(batch)])
        seeded = [not bool(greedy[b]) and rng.random() < 0.8 for b in range(batch)]
        y = torch.randint(0, vocab, (total + batch,), generator=gen)
        drafts = torch.full((batch, k), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
        first = []
        start = 0
        for b in range(batch):
            n = int(num_draft[b])
            first.append(start)
            drafts[b, :n] = torch.randint(0, vocab + 2, (n,), generator=gen)
            if seeded[b]:
                hit = torch.rand(n, generator=gen) < 0.7          # drafts often equal y
                drafts[b, :n] = torch.where(hit, y[start:start + n], drafts[b, :n])
                if it % 3 == 0:                                   # p kept as logits
                    p[start:start + n + 1] = log_probs(p[start:start + n + 1])
            start += n + 1
        torch.manual_seed(it)
        fast = rejection_sample(drafts, num_draft, q, p, greedy, seeded, y)
        torch.manual_seed(it)
        ref = rejection_sample_reference(drafts, num_draft, q, p, greedy, seeded, y)
        assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1]), it
        out, acc = fast
        for b in range(batch):
            if not seeded[b]:
                continue
            n, a, f = int(num_draft[b]), int(acc[b]), first[b]
            want = 0
            while want < n and int(drafts[b, want]) == int(y[f + want]):
                want += 1
            assert a == want, (it, b)
            assert out[b, :a].tolist() == drafts[b, :a].tolist()
            assert int(out[b, a]) == int(y[f + a])
            assert bool((out[b, a + 1:] == PLACEHOLDER_TOKEN_ID).all())
            kept += a
            stopped += int(a < n)
    assert kept > 0 and stopped > 0


def test_seeded_rows_need_seeded_tokens():
    p = torch.full((2, 3), 1 / 3)
    args = (torch.zeros(1, 1, dtype=torch.long), torch.tensor([1]), None, p,
            torch.tensor([False]))
    with pytest.raises(ValueError, match="need seeded_tokens"):
        rejection_sample(*args, [True])
    with pytest.raises(ValueError, match="need seeded_tokens"):
        rejection_sample(*args, [True], torch.zeros(1, dtype=torch.long))   # T is 2
    with pytest.raises(ValueError, match="seeded flags"):
        rejection_sample(*args, [True, True], torch.zeros(2, dtype=torch.long))
    rejection_sample(*args, [False])                        # unseeded: fine
    rejection_sample(*args)
    rejection_sample(torch.zeros(1, 1, dtype=torch.long), torch.tensor([1]), None, p,
                     torch.tensor([True]), [False])         # greedy: argmax, no y
    out, acc = rejection_sample(*args, [True], torch.tensor([0, 2]))
    assert out.tolist() == [[0, 2]] and acc.tolist() == [1]   # draft 0 == y_0, then y_1


# ------------------------------------------------------------------ draft side


def test_draft_sampler_drafts_with_the_noise_verification_uses():
    """A seeded row whose pass 0 drafts output index s drafts, at pass ``pos``, the
    stream's token s + pos on q's processed logits. Verifying those drafts against p =
    q's logits with the same stream's tokens from s accepts them all; from s + 1 (an
    off-by-one) they are mostly rejected: the check has teeth."""
    vocab, k = 200, 6
    specs = [SamplingSpec(temperature=0.8, seed=11), None, SamplingSpec(temperature=1.0, seed=12),
             SamplingSpec(temperature=1.0, top_p=0.9),
             SamplingSpec(temperature=0.9, top_p=0.9, seed=13)]
    streams = [(SeedStream(11, 30), 5), None, (SeedStream(12, 7), 0), None,
               (SeedStream(13, 64), 17)]
    sampler = DraftSampler(specs, [[]] * 5, [[]] * 5, streams, k, vocab, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(5, vocab, generator=g) * 2 for _ in range(k)]
    drafts = torch.zeros(5, k, dtype=torch.long)
    for pos in range(k):
        drafts[:, pos] = sampler.pick(logits[pos].clone(), pos, drafts)
    checked = 0
    for m, row in enumerate(sampler.sampled):
        if streams[row] is None:
            continue
        stream, start = streams[row]
        q_logits = torch.cat([target_probs(logits[pos][row:row + 1], [specs[row]], [[]], [[]],
                                           keep_logits=[True]) for pos in range(k)])  # [k, V]
        assert torch.equal(sampler.q[m], torch.softmax(q_logits, dim=-1)), row   # q: probs
        fresh = SeedStream(specs[row].seed, stream.prompt_len)
        assert drafts[row].tolist() == seeded_tokens(q_logits, fresh, start).tolist(), row
        p = torch.cat([q_logits, torch.zeros(1, vocab)])                       # + bonus row
        for s0, all_in in ((start, True), (start + 1, False)):
            y = seeded_tokens(p, stream, s0)
            _, acc = rejection_sample(drafts[row:row + 1], torch.tensor([k]), sampler.q[m], p,
                                      torch.tensor([False]), [True], y)
            assert (int(acc[0]) == k) == all_in, (row, s0, int(acc[0]))
        checked += 1
    assert checked == 3


def test_draft_sampler_seeded_drafts_repeat_and_unseeded_rows_sample_q():
    vocab, k = 50, 4
    spec = SamplingSpec(temperature=1.0)
    g = torch.Generator().manual_seed(1)
    logits = [torch.randn(2, vocab, generator=g) for _ in range(k)]

    def run(seed_row0, torch_seed):
        torch.manual_seed(torch_seed)
        s = DraftSampler([spec, spec], [[]] * 2, [[]] * 2, [(SeedStream(seed_row0, 9), 0), None],
                         k, vocab, torch.device("cpu"))
        d = torch.zeros(2, k, dtype=torch.long)
        for pos in range(k):
            d[:, pos] = s.pick(logits[pos].clone(), pos, d)
        return d

    a, b = run(3, 0), run(3, 1)
    assert torch.equal(a[0], b[0])              # seeded: independent of torch's state
    assert not torch.equal(run(3, 0)[0], run(4, 0)[0])
    assert not torch.equal(run(3, 0)[1], run(3, 5)[1])   # unseeded: torch's default stream
