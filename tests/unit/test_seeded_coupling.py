"""Seeded sampled rows: the position-keyed exponential race (rejection.py docstring; token_draw.py).

The token a seeded request emits at absolute position t is y_t = first_argmax(p_t /
E_t), E_t = position_noise(seed, t): whatever was drafted, however many drafts a step
had and whoever shared the batch. Checked here on a Markov-chain "model" (p_t =
P[token at t-1], so drafts change the p rows a step verifies, as in a real model),
against the plain sequential race. The race itself is checked to sample p
(chi-squared, with negative controls), the noise to be positive and distinct per
(seed, t), and the draft sampler to use the same positions as verification.

Statistics as in test_rejection_math.py: each check at ALPHA = 1e-3 / MAX_CHECKS
(Bonferroni over this module), fixed seeds, so outcomes are deterministic.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from test_rejection_math import chi2_pvalue, random_dist
from vllm_specdec_plugin.draft.sampler import DraftSampler
from vllm_specdec_plugin.rejection import PLACEHOLDER_TOKEN_ID, rejection_sample
from vllm_specdec_plugin.rejection_reference import rejection_sample_reference
from vllm_specdec_plugin.sampling.pipeline import SamplingSpec
from vllm_specdec_plugin.token_draw import (coupled_token, first_argmax, noise_seed,
                                            position_noise, position_noise_rows)

pytestmark = pytest.mark.unit

MAX_CHECKS = 16
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


# ------------------------------------------------------------------ drafts never matter


VOCAB = 40


def _chain(seed):
    gen = torch.Generator().manual_seed(seed)
    P = torch.stack([random_dist(gen, VOCAB, scale=2.5, zero_frac=0.3) for _ in range(VOCAB)])
    Q = torch.stack([random_dist(gen, VOCAB, scale=2.5) for _ in range(VOCAB)])
    Q = 0.5 * Q + 0.5 * P                 # a draft that is right about half the time
    return P, Q


def sequential(P, seed, t0, length, start=0):
    """No speculation: y_t = race(P[y_{t-1}], seed, t) one token at a time."""
    out, prev = [], start
    for t in range(t0, t0 + length):
        prev = race(P[prev], seed, t)
        out.append(prev)
    return out


def _drafts(kind, P, Q, prev, seed, t, k, rng, history):
    """(k draft ids, q rows [k, V] or None) of one step, by drafter ``kind``."""
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
            ctx = race(P[ctx], seed, t + j)
            x.append(ctx)
        return x, None
    if kind == "ngram":      # point masses: the last k tokens again
        return (history[-k:] + [1] * k)[:k] if k else [], None
    if kind == "coupled":    # the draft sampler's rule: race q on the same noise
        x, ctx, rows = [], prev, []
        for j in range(k):
            rows.append(Q[ctx])
            ctx = race(Q[ctx], seed, t + j)
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
    """Random neighbour rows: (drafts, p rows, q rows, greedy, seed, t0) each."""
    rows = []
    for _ in range(n):
        k = rng.randrange(k_max + 1)
        p = torch.stack([random_dist(gen, VOCAB) for _ in range(k + 1)])
        q = torch.stack([random_dist(gen, VOCAB) for _ in range(k)]) if k else None
        drafts = [int(torch.multinomial(q[j], 1, generator=gen)) for j in range(k)]
        greedy = rng.random() < 0.3
        seed = None if rng.random() < 0.5 else rng.randrange(1000)
        rows.append((drafts, p, q, greedy, seed, rng.randrange(500)))
    return rows


def speculative(P, Q, seed, t0, length, kind, k_of_step, rng, fn=rejection_sample,
                neighbours=0):
    """Decode ``length`` tokens of one seeded row with drafts of ``kind``, k per step
    from ``k_of_step``, among ``neighbours`` random rows; returns (tokens, drafted,
    accepted)."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    out, prev, drafted, accepted, step = [], 0, 0, 0, 0
    while len(out) < length:
        t = t0 + len(out)
        k = k_of_step(step)
        step += 1
        x, q_rows = _drafts(kind, P, Q, prev, seed, t, k, rng, out)
        drafted += len(x)
        ctx = [prev] + [d if 0 <= d < VOCAB else 0 for d in x]
        ours = (x, P[ctx], q_rows, False, seed, t)
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
                              [r[4] for r in rows], [r[5] for r in rows])
        tokens = out_ids[at, : int(num_acc[at]) + 1].tolist()
        accepted += int(num_acc[at])
        out += tokens
        prev = tokens[-1]
    return out[:length], drafted, accepted


KINDS = ["random", "invalid", "oracle", "ngram", "coupled", "sampled"]


@pytest.mark.parametrize("kind", KINDS)
def test_seeded_output_identical_for_every_k_and_drafter(kind):
    P, Q = _chain(5)
    for seed, t0 in ((7, 12), (2**40 + 3, 0)):
        want = sequential(P, seed, t0, 30)
        for k in range(9):
            rng = random.Random(k)
            got, drafted, _ = speculative(P, Q, seed, t0, 30, kind, lambda s: k, rng,
                                          neighbours=2)
            assert got == want, (kind, seed, k)
            assert (drafted > 0) == (k > 0)
    # A different seed gives a different output (the check above is not vacuous).
    assert sequential(P, 8, 12, 30) != sequential(P, 7, 12, 30)


def test_seeded_output_identical_under_changing_schedules_and_neighbours():
    P, Q = _chain(6)
    want = sequential(P, 99, 40, 40)
    for trial in range(6):
        rng = random.Random(100 + trial)
        schedule = [rng.randrange(9) for _ in range(64)]
        kind = KINDS[trial % len(KINDS)]
        got, _, _ = speculative(P, Q, 99, 40, 40, kind, lambda s: schedule[s], rng,
                                neighbours=rng.randrange(8))
        assert got == want, (trial, kind)
    ref, _, _ = speculative(P, Q, 99, 40, 40, "coupled", lambda s: 3, random.Random(1),
                            fn=rejection_sample_reference, neighbours=3)
    assert ref == want


def test_drafts_equal_to_y_always_accepted_coupled_often_random_rarely():
    P, Q = _chain(7)
    rate = {}
    for kind in ("oracle", "coupled", "random"):
        _, drafted, accepted = speculative(P, Q, 5, 0, 200, kind, lambda s: 4,
                                           random.Random(0))
        rate[kind] = accepted / drafted
    assert rate["oracle"] == 1.0
    assert rate["coupled"] > 0.3 > 0.15 > rate["random"], rate   # Q is half P


# ------------------------------------------------------------------ fast == reference


@pytest.mark.parametrize("vocab", [7, 300])
def test_fast_matches_reference_on_seeded_rows(vocab):
    gen = torch.Generator().manual_seed(vocab)
    rng = random.Random(vocab)
    for it in range(10):
        batch, k = 12, 8
        num_draft = torch.tensor([rng.randrange(k + 1) for _ in range(batch)])
        total = int(num_draft.sum())
        p = torch.stack([random_dist(gen, vocab, scale=2.0, zero_frac=0.2)
                         for _ in range(total + batch)])
        q = torch.stack([random_dist(gen, vocab) for _ in range(total)]) if it % 2 else None
        drafts = torch.full((batch, k), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
        for b in range(batch):
            drafts[b, : int(num_draft[b])] = torch.randint(0, vocab + 2, (int(num_draft[b]),),
                                                           generator=gen)
        greedy = torch.tensor([rng.random() < 0.2 for _ in range(batch)])
        seeds = [rng.randrange(2**62) if rng.random() < 0.8 else None for _ in range(batch)]
        positions = [rng.randrange(4000) for _ in range(batch)]
        torch.manual_seed(it)
        fast = rejection_sample(drafts, num_draft, q, p, greedy, seeds, positions)
        torch.manual_seed(it)
        ref = rejection_sample_reference(drafts, num_draft, q, p, greedy, seeds, positions)
        assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1]), it


def test_seeded_rows_need_positions():
    p = torch.full((2, 3), 1 / 3)
    args = (torch.zeros(1, 1, dtype=torch.long), torch.tensor([1]), None, p,
            torch.tensor([False]))
    with pytest.raises(ValueError, match="positions"):
        rejection_sample(*args, [5])
    rejection_sample(*args, [None])                         # unseeded: fine
    rejection_sample(torch.zeros(1, 1, dtype=torch.long), torch.tensor([1]), None, p,
                     torch.tensor([True]), [5])             # greedy ignores its seed


# ------------------------------------------------------------------ draft side


def test_draft_sampler_races_at_the_positions_verification_uses():
    """DraftSampler's pass ``pos`` of a row at committed length L races on E_{L+pos};
    verifying those drafts against p = q at t0 = L accepts them all. At t0 = L + 1
    (an off-by-one) they are mostly rejected: the check has teeth."""
    vocab, k = 200, 6
    specs = [SamplingSpec(temperature=0.8), None, SamplingSpec(temperature=1.0),
             SamplingSpec(temperature=1.0, top_p=0.9)]
    seeds, lengths = [11, None, 12, None], [30, 31, 7, 64]
    sampler = DraftSampler(specs, [[]] * 4, [[]] * 4, seeds, k, vocab, torch.device("cpu"),
                           lengths=lengths)
    g = torch.Generator().manual_seed(0)
    drafts = torch.zeros(4, k, dtype=torch.long)
    for pos in range(k):
        drafts[:, pos] = sampler.pick(torch.randn(4, vocab, generator=g) * 2, pos, drafts)
    for m, row in enumerate(sampler.sampled):
        if seeds[row] is None:
            continue
        q = sampler.q[m]                                                    # [k, V]
        p = torch.cat([q, torch.full((1, vocab), 1.0 / vocab)])           # + bonus row
        for t0, all_in in ((lengths[row], True), (lengths[row] + 1, False)):
            _, acc = rejection_sample(drafts[row:row + 1], torch.tensor([k]), q, p,
                                      torch.tensor([False]), [seeds[row]], [t0])
            assert (int(acc[0]) == k) == all_in, (row, t0, int(acc[0]))
    with pytest.raises(ValueError, match="lengths"):
        DraftSampler(specs, [[]] * 4, [[]] * 4, seeds, k, vocab, torch.device("cpu"))


def test_draft_sampler_seeded_drafts_repeat_and_unseeded_rows_sample_q():
    vocab, k = 50, 4
    spec = SamplingSpec(temperature=1.0)
    g = torch.Generator().manual_seed(1)
    logits = [torch.randn(2, vocab, generator=g) for _ in range(k)]

    def run(seed_row0, torch_seed):
        torch.manual_seed(torch_seed)
        s = DraftSampler([spec, spec], [[]] * 2, [[]] * 2, [seed_row0, None], k, vocab,
                         torch.device("cpu"), lengths=[9, 9])
        d = torch.zeros(2, k, dtype=torch.long)
        for pos in range(k):
            d[:, pos] = s.pick(logits[pos].clone(), pos, d)
        return d

    a, b = run(3, 0), run(3, 1)
    assert torch.equal(a[0], b[0])              # seeded: independent of torch's state
    assert not torch.equal(run(3, 0)[0], run(4, 0)[0])
    assert not torch.equal(run(3, 0)[1], run(3, 5)[1])   # unseeded: torch's default stream
