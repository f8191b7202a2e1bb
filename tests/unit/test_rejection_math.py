"""Rejection sampling: fast == reference, statistical exactness, seeded determinism.
(Seeded rows here take y_j from the position-keyed race, the fallback noise; vLLM's
own seed stream and op, and drafter invariance: tests/unit/test_seeded_coupling.py.)

Statistics. Every statistical check is a test at level ALPHA = 1e-3 / MAX_CHECKS
(Bonferroni), so all checks in this module together hold at 99.9% confidence
(family-wise); the seeds are fixed, so the outcome is deterministic.

- Distribution checks: Pearson chi-squared goodness of fit against the exact
  distribution, with cells pooled (in order of expected count, a rule that depends
  only on the null distribution and N, never on the data) until each expected count
  is >= 5; p-value from the chi-squared survival function
  (`torch.special.gammaincc(df / 2, x / 2)`). A token that has probability 0 under p
  but occurs fails outright.
- Acceptance rate: |accepted / N - sum(min(p, q))| <= z * sqrt(beta(1 - beta) / N)
  + 1 / N, z the two-sided normal quantile at ALPHA (normal approximation to the
  binomial, N >= 5e4).

Each statistic has a negative control: a broken rule implemented here (never in
the module) that the same check must reject.
"""

from __future__ import annotations

import math

import pytest
import torch

from specdec_testing import rejection_reference
from vllm_specdec_plugin import rejection
from vllm_specdec_plugin.rejection import PLACEHOLDER_TOKEN_ID, greedy_verify
from vllm_specdec_plugin.token_draw import coupled_token, position_noise_rows

pytestmark = pytest.mark.unit


def flatten(x, num_draft, extra):
    """Padded [B, P, V] -> the flat layout [sum(n_b + extra), V]: each row's first
    n_b + extra positions, rows in order (extra 1 for p, 0 for q)."""
    return x[torch.arange(x.shape[1]) < (num_draft + extra).unsqueeze(1)]


def padded(fn):
    """fn (flat p and q) called with padded p [B, K+1, V] and q [B, K, V]: the
    tests below build batches padded, which is easier to read. Seeded sampled rows
    (``seeds[b]`` set, not greedy) get their y_j as the fallback's caller draws them:
    the race first_argmax(p_j / E_{t0+j}), t0 = ``positions[b]``."""
    def run(drafts, num_draft, draft_probs, target_probs, is_greedy, seeds=None,
            positions=None):
        q = None if draft_probs is None else flatten(draft_probs, num_draft, 0)
        p = flatten(target_probs, num_draft, 1)
        return fn(drafts, num_draft, q, p, is_greedy,
                  *race_tokens(p, num_draft, is_greedy, seeds, positions))
    return run


def race_tokens(p, num_draft, is_greedy, seeds, positions):
    """(seeded [B], seeded_tokens [T] or None) for flat p: per seeded sampled row, y_j =
    coupled_token(p_j, position_noise(seed, t0 + j)) on its n_b + 1 rows."""
    if seeds is None:
        return None, None
    seeded = [s is not None and not bool(g) for s, g in zip(seeds, is_greedy)]
    y = torch.zeros(p.shape[0], dtype=torch.long)
    start = 0
    for b, n in enumerate(num_draft.tolist()):
        if seeded[b]:
            noise = position_noise_rows(seeds[b], positions[b], n + 1, p.shape[1])
            y[start:start + n + 1] = coupled_token(p[start:start + n + 1], noise)
        start += n + 1
    return seeded, y


rejection_sample = padded(rejection.rejection_sample)
rejection_sample_reference = padded(rejection_reference.rejection_sample_reference)

FAMILY_ALPHA = 1e-3
MAX_CHECKS = 64  # upper bound on statistical checks in this module
ALPHA = FAMILY_ALPHA / MAX_CHECKS
Z = float(torch.special.ndtri(torch.tensor(1 - ALPHA / 2, dtype=torch.float64)))

JOINT_DRAWS = 100_000  # rows per joint-distribution case


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are small per op; on a busy 2-core machine intra-op threading
    costs more in wake-ups than it saves (measured: ~7 ms per op vs 0.1 ms)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------ statistics


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness-of-fit p-value of samples [N] (ids in [0, C)) against probs [C]."""
    probs = probs.double() / probs.double().sum()
    n = samples.numel()
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    if counts[probs == 0].sum() > 0:
        return 0.0
    expected = probs * n
    support = torch.nonzero(probs > 0).squeeze(1)
    order = support[torch.argsort(expected[support])]
    obs_groups, exp_groups = [], []
    obs_acc = exp_acc = 0.0
    for idx in order.tolist():
        obs_acc += float(counts[idx])
        exp_acc += float(expected[idx])
        if exp_acc >= 5.0:
            obs_groups.append(obs_acc)
            exp_groups.append(exp_acc)
            obs_acc = exp_acc = 0.0
    if exp_acc > 0:  # leftover small cell: merge into the last group
        if exp_groups:
            obs_groups[-1] += obs_acc
            exp_groups[-1] += exp_acc
        else:
            obs_groups.append(obs_acc)
            exp_groups.append(exp_acc)
    df = len(exp_groups) - 1
    if df == 0:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in zip(obs_groups, exp_groups))
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


def rate_within_bound(successes: int, n: int, beta: float) -> bool:
    bound = Z * math.sqrt(max(beta * (1 - beta), 0.0) / n) + 1.0 / n
    return abs(successes / n - beta) <= bound


# ------------------------------------------------------------------ case builders


def random_dist(gen, vocab, scale=1.0, zero_frac=0.0):
    logits = torch.randn(vocab, generator=gen, dtype=torch.float64) * scale
    if zero_frac > 0:
        zero = torch.rand(vocab, generator=gen) < zero_frac
        zero[int(torch.argmax(logits))] = False
        logits[zero] = -math.inf
    return torch.softmax(logits, 0).float()


def first_token_cases():
    """(name, vocab, K, num_draft, p0, q0 or None, proposal r used to draw drafts, N)."""
    gen = torch.Generator().manual_seed(1234)
    cases = []

    def add(name, vocab, k, n, p0, q0, r, draws):
        cases.append((name, vocab, k, n, p0, q0, r, draws))

    p, q = random_dist(gen, 2), random_dist(gen, 2)
    add("V2", 2, 1, 1, p, q, q, 100_000)
    p = random_dist(gen, 3)
    add("V3 q==p", 3, 1, 1, p, p.clone(), p, 100_000)
    p = torch.tensor([0.7, 0.3, 0.0, 0.0])
    q = torch.tensor([0.0, 0.0, 0.4, 0.6])
    add("V4 disjoint", 4, 1, 1, p, q, q, 100_000)
    p, q = random_dist(gen, 5, zero_frac=0.4), random_dist(gen, 5)
    add("V5 p with zeros", 5, 1, 1, p, q, q, 100_000)
    p, r = random_dist(gen, 8), random_dist(gen, 8, scale=2.0)
    add("V8 point-mass draft", 8, 1, 1, p, None, r, 100_000)
    p, q = random_dist(gen, 16), random_dist(gen, 16)
    add("V16 K3", 16, 3, 3, p, q, q, 100_000)
    p, q = random_dist(gen, 64, scale=3.0), random_dist(gen, 64, scale=0.5)
    add("V64 peaked p", 64, 2, 2, p, q, q, 100_000)
    logits = torch.randn(257, generator=gen, dtype=torch.float64) * 2
    p, q = torch.softmax(logits, 0).float(), torch.softmax(logits / 1.7, 0).float()
    add("V257 draft at higher temperature", 257, 1, 1, p, q, q, 100_000)
    p = random_dist(gen, 100)
    add("V100 zero drafts", 100, 2, 0, p, random_dist(gen, 100), p, 100_000)
    p, q = random_dist(gen, 1024, scale=2.0), random_dist(gen, 1024, scale=2.0)
    add("V1024 K3", 1024, 3, 3, p, q, q, 50_000)
    p, q = random_dist(gen, 2048, scale=2.0), random_dist(gen, 2048, scale=1.0)
    add("V2048", 2048, 1, 1, p, q, q, 50_000)
    p, r = random_dist(gen, 2048, scale=2.0), random_dist(gen, 2048, scale=2.0)
    add("V2048 point-mass draft", 2048, 1, 1, p, None, r, 50_000)
    return cases


def run_first_token_case(case, seed, rule=rejection_sample, chunk=5_000):
    """First output token [N] and num_accepted [N] for one case, drawn in chunks."""
    name, vocab, k, n, p0, q0, r, draws = case
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    # Later positions get their own fixed distributions; only position 0 matters
    # for the first token.
    p_rest = torch.stack([random_dist(gen, vocab) for _ in range(k)])  # [K, V]
    q_rest = torch.stack([random_dist(gen, vocab) for _ in range(k - 1)]) if k > 1 else None
    target = torch.cat([p0.unsqueeze(0), p_rest])  # [K+1, V]
    draft = None
    if q0 is not None:
        draft = q0.unsqueeze(0) if q_rest is None else torch.cat([q0.unsqueeze(0), q_rest])
    proposals = [r] + ([] if q_rest is None else list(q_rest))  # what drafts are drawn from
    firsts, accepted = [], []
    for start in range(0, draws, chunk):
        size = min(chunk, draws - start)
        drafts = torch.stack(
            [
                torch.multinomial(proposals[j], size, replacement=True, generator=gen)
                for j in range(k)
            ],
            dim=1,
        )  # [size, K]
        drafts[:, n:] = PLACEHOLDER_TOKEN_ID
        out, num_acc = rule(
            drafts,
            torch.full((size,), n, dtype=torch.long),
            None if draft is None else draft.expand(size, k, vocab),
            target.expand(size, k + 1, vocab),
            torch.zeros(size, dtype=torch.bool),
            None,
        )
        firsts.append(out[:, 0])
        accepted.append(num_acc)
    return torch.cat(firsts), torch.cat(accepted)


def acceptance_rate(p0, q0, r):
    """P(first draft accepted): sum(min(p, q)), or sum(r * p) for a point-mass draft."""
    if q0 is None:
        return float((r.double() * p0.double()).sum())
    return float(torch.minimum(p0.double(), q0.double()).sum())


# ------------------------------------------------------------------ statistical exactness


@pytest.mark.parametrize("case", first_token_cases(), ids=lambda c: c[0])
def test_first_token_distribution_and_acceptance_rate(case):
    name, vocab, k, n, p0, q0, r, draws = case
    first, num_acc = run_first_token_case(case, seed=sum(map(ord, name)))
    pvalue = chi2_pvalue(first, p0)
    assert pvalue > ALPHA, f"{name}: first token not ~ p (p-value {pvalue:.3g})"
    if n > 0:
        beta = acceptance_rate(p0, q0, r)
        accepted = int((num_acc > 0).sum())
        assert rate_within_bound(accepted, draws, beta), (
            f"{name}: acceptance {accepted / draws:.5f} vs sum(min(p, q)) {beta:.5f}"
        )


def _accept_always(drafts, num_draft, draft_probs, target_probs, is_greedy, seeds):
    """BROKEN rule (negative control): keep every draft, then a bonus token from p."""
    out, num_acc = rejection_sample(
        drafts, num_draft, None, target_probs, is_greedy, seeds
    )
    k = drafts.shape[1]
    keep = torch.arange(k).unsqueeze(0) < num_draft.unsqueeze(1)
    out[:, :k] = torch.where(keep, drafts, out[:, :k])
    return out, num_draft.clone()


def _recover_from_p(drafts, num_draft, draft_probs, target_probs, is_greedy, seeds):
    """BROKEN rule (negative control): on rejection sample from p, not max(0, p - q)."""
    p = target_probs[:, 0]
    q = draft_probs[:, 0]
    x = drafts[:, 0]
    px, qx = p.gather(1, x[:, None])[:, 0], q.gather(1, x[:, None])[:, 0]
    accept = torch.rand(x.shape[0], dtype=torch.float64) <= px.double() / qx.double()
    fallback = torch.multinomial(p, 1)[:, 0]
    out = torch.where(accept, x, fallback).unsqueeze(1)
    return out, accept.long()


def _accept_with_p(drafts, num_draft, draft_probs, target_probs, is_greedy, seeds):
    """BROKEN rule (negative control): accept with probability p(x), ignoring q."""
    p = target_probs[:, 0]
    x = drafts[:, 0]
    accept = torch.rand(x.shape[0], dtype=torch.float64) < p.gather(1, x[:, None])[:, 0].double()
    return x.unsqueeze(1), accept.long()


def test_negative_controls_fail_the_same_checks():
    cases = {c[0]: c for c in first_token_cases()}

    # accept-always: the first token is ~ q, rejected outright or by chi-squared.
    for name in ("V16 K3", "V4 disjoint", "V257 draft at higher temperature"):
        first, _ = run_first_token_case(cases[name], seed=7, rule=_accept_always)
        assert chi2_pvalue(first, cases[name][4]) < ALPHA, name

    # Recovering from p instead of the residual: first token ~ min(p, q) + (1 - beta) p.
    case = cases["V16 K3"]
    name, vocab, k, n, p0, q0, r, draws = case
    first, _ = run_first_token_case(case, seed=8, rule=_recover_from_p)
    assert chi2_pvalue(first, p0) < ALPHA

    # Accepting with probability p(x): the acceptance rate is sum(q p), not sum(min(p, q)).
    _, num_acc = run_first_token_case(case, seed=9, rule=_accept_with_p)
    assert not rate_within_bound(int((num_acc > 0).sum()), draws, acceptance_rate(p0, q0, r))


def markov_chain(vocab, seed, sharp):
    """Transition matrices P (target) and Q (draft), [V, V] rows = next-token dists."""
    gen = torch.Generator().manual_seed(seed)
    P = torch.stack([random_dist(gen, vocab, scale=sharp) for _ in range(vocab)])
    Q = torch.stack([random_dist(gen, vocab, scale=sharp) for _ in range(vocab)])
    return P, Q


def simulate_chain(P, Q, k, draws, length, seed, use_draft_probs=True, rule=rejection_sample):
    """Generate `length` tokens per row with speculative steps of up to k drafts.

    The "models" are Markov chains: p(x_t | x_{t-1}) = P[x_{t-1}], drafts from
    Q[x_{t-1}]; the context starts at token 0. Each step draws a random number of
    drafts in 0..k per row (placeholder-padded), verifies them and appends the
    output. Returns tokens [draws, length].
    """
    torch.manual_seed(seed)
    vocab = P.shape[0]
    seq = torch.full((draws, length + k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long)
    filled = torch.zeros(draws, dtype=torch.long)
    context = torch.zeros(draws, dtype=torch.long)
    while bool((filled < length).any()):
        active = torch.nonzero(filled < length).squeeze(1)
        size = active.numel()
        ctx = torch.empty(size, k + 1, dtype=torch.long)  # token each position conditions on
        ctx[:, 0] = context[active]
        for j in range(k):
            ctx[:, j + 1] = torch.multinomial(Q[ctx[:, j]], 1)[:, 0]
        drafts = ctx[:, 1:].clone()
        num_draft = torch.randint(0, k + 1, (size,))
        drafts[torch.arange(k).unsqueeze(0) >= num_draft.unsqueeze(1)] = PLACEHOLDER_TOKEN_ID
        out, num_acc = rule(
            drafts,
            num_draft,
            Q[ctx[:, :k]] if use_draft_probs else None,
            P[ctx],
            torch.zeros(size, dtype=torch.bool),
            None,
        )
        for j in range(k + 1):
            write = j <= num_acc
            seq[active[write], filled[active[write]] + j] = out[write, j]
        filled[active] += num_acc + 1
        context[active] = out[torch.arange(size), num_acc]
    return seq[:, :length]


def joint_probs(P, length):
    """Exact joint of the first `length` tokens from context 0: [V ** length].

    Cell ids are base-V numbers x_1 x_2 ... x_T (see `encode`).
    """
    vocab = P.shape[0]
    joint = P[0].double()  # [V]
    for _ in range(length - 1):
        last = torch.arange(joint.numel()) % vocab  # x_t of each cell
        joint = (joint.unsqueeze(1) * P.double()[last]).reshape(-1)
    return joint


def encode(tokens, vocab):
    """[N, T] tokens -> [N] cell ids in [0, V ** T)."""
    cell = torch.zeros(tokens.shape[0], dtype=torch.long)
    for t in range(tokens.shape[1]):
        cell = cell * vocab + tokens[:, t]
    return cell


JOINT_CASES = [(1, True, 2, 4), (2, True, 3, 3), (3, True, 3, 4), (2, False, 3, 3)]


@pytest.mark.parametrize(
    "k,use_draft_probs,length,vocab",
    JOINT_CASES,
    ids=["K1-two-tokens", "K2-three-tokens", "K3-three-tokens", "K2-point-mass"],
)
def test_joint_distribution_of_several_positions(k, use_draft_probs, length, vocab):
    draws = JOINT_DRAWS
    P, Q = markov_chain(vocab, seed=10 + k, sharp=1.5)
    tokens = simulate_chain(P, Q, k, draws, length, seed=20 + k, use_draft_probs=use_draft_probs)
    pvalue = chi2_pvalue(encode(tokens, vocab), joint_probs(P, length))
    assert pvalue > ALPHA, f"joint of {length} tokens not ~ p (p-value {pvalue:.3g})"


def _bonus_from_first_position(drafts, num_draft, draft_probs, target_probs, is_greedy, seeds):
    """BROKEN rule (negative control): the bonus token is drawn from p at position 0."""
    out, num_acc = rejection_sample(drafts, num_draft, draft_probs, target_probs, is_greedy, seeds)
    all_acc = (num_acc == num_draft) & (num_draft > 0)
    wrong = torch.multinomial(target_probs[:, 0], 1)[:, 0]
    out[all_acc, num_acc[all_acc]] = wrong[all_acc]
    return out, num_acc


def test_joint_negative_control():
    vocab, k, length, draws = 3, 2, 3, 100_000
    P, Q = markov_chain(vocab, seed=12, sharp=1.5)
    tokens = simulate_chain(P, Q, k, draws, length, seed=30, rule=_bonus_from_first_position)
    assert chi2_pvalue(encode(tokens, vocab), joint_probs(P, length)) < ALPHA
    # The first token alone is still right: the bug only shows in the joint.
    assert chi2_pvalue(tokens[:, 0], P[0]) > ALPHA


# ------------------------------------------------------------------ fast == reference


def random_batch(gen, batch, k, vocab):
    """A mixed batch exercising every branch; returns the rejection_sample arguments."""

    def dists(n):
        return torch.stack([random_dist(gen, vocab, scale=2.0, zero_frac=0.2) for _ in range(n)])

    target = torch.stack([dists(k + 1) for _ in range(batch)])  # [B, K+1, V]
    draft = torch.stack([dists(k) for _ in range(batch)])  # [B, K, V]
    # 0 plain, 1 q == p (all accepted), 2 all-zero q rows (point mass),
    # 3 drafts where p is 0 (none accepted), 4 greedy on the argmax, 5 greedy off it.
    kind = torch.randint(0, 6, (batch,), generator=gen)
    draft[kind == 1] = target[kind == 1, :k]
    draft[kind == 2] = 0.0
    proposal = torch.where((kind == 2).view(-1, 1, 1), target[:, :k], draft)
    drafts = torch.multinomial(proposal.reshape(-1, vocab), 1, generator=gen).view(batch, k)
    for b in torch.nonzero(kind == 3).squeeze(1).tolist():
        for j in range(k):
            zeros = torch.nonzero(target[b, j] == 0).squeeze(1)
            if zeros.numel():
                drafts[b, j] = zeros[0]
                draft[b, j] = 0.0
                draft[b, j, zeros[0]] = 1.0
    greedy = kind >= 4
    drafts[kind == 4] = target.argmax(-1)[kind == 4, :k]
    num_draft = torch.randint(1, k + 1, (batch,), generator=gen)
    num_draft[torch.rand(batch, generator=gen) < 0.15] = 0  # zero drafts
    drafts[torch.arange(k).unsqueeze(0) >= num_draft.unsqueeze(1)] = PLACEHOLDER_TOKEN_ID
    # Now and then an invalid id inside the drafts: always rejected.
    bad = (torch.rand(batch, generator=gen) < 0.05) & (num_draft > 0)
    drafts[bad, 0] = vocab + 3
    return drafts, num_draft, draft, target, greedy


def seeded(batch, base, every=1):
    """(seeds, positions) [B]: every ``every``-th row seeded with base + b, the others
    None; positions t0 spread over 0..999."""
    seeds = [base + b if b % every == 0 else None for b in range(batch)]
    return seeds, [(base * 7 + 13 * b) % 1000 for b in range(batch)]


@pytest.mark.parametrize("vocab", [5, 37])
@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_fast_matches_reference_bit_for_bit(vocab, with_draft_probs):
    """Every row, unseeded ones too: from the same default-generator state both draw
    the same batched uniforms; seeded rows race on the same position noise."""
    gen = torch.Generator().manual_seed(vocab * 2 + with_draft_probs)
    batch, k = 48, 4
    seen = {"all": 0, "none": 0, "zero_drafts": 0, "greedy": 0, "seeded": 0}
    for it in range(12):
        drafts, num_draft, draft, target, greedy = random_batch(gen, batch, k, vocab)
        dp = draft if with_draft_probs else None
        args = (drafts, num_draft, dp, target, greedy, *seeded(batch, 100 * it, every=2))
        torch.manual_seed(it)
        fast = rejection_sample(*args)
        torch.manual_seed(it)
        ref = rejection_sample_reference(*args)
        assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1]), it
        out, num_acc = fast
        check_structure(out, num_acc, drafts, num_draft, vocab)
        seen["all"] += int(((num_acc == num_draft) & (num_draft > 0)).sum())
        seen["none"] += int(((num_acc == 0) & (num_draft > 0)).sum())
        seen["zero_drafts"] += int((num_draft == 0).sum())
        seen["greedy"] += int(greedy.sum())
        seen["seeded"] += int(((torch.arange(batch) % 2 == 0) & ~greedy).sum())
    assert all(v > 0 for v in seen.values()), seen


def check_structure(out, num_acc, drafts, num_draft, vocab):
    batch, width = out.shape
    for b in range(batch):
        a = int(num_acc[b])
        assert 0 <= a <= int(num_draft[b])
        assert torch.equal(out[b, :a], drafts[b, :a])
        assert 0 <= int(out[b, a]) < vocab
        assert bool((out[b, a + 1 :] == PLACEHOLDER_TOKEN_ID).all())


def test_unseeded_rows_and_empty_k():
    gen = torch.Generator().manual_seed(5)
    drafts, num_draft, draft, target, greedy = random_batch(gen, 16, 3, 11)
    out, num_acc = rejection_sample(drafts, num_draft, draft, target, greedy, None)
    check_structure(out, num_acc, drafts, num_draft, 11)
    # K = 0: every row samples one token from p at position 0.
    p = torch.tensor([[[0.0, 1.0, 0.0]], [[0.0, 0.0, 1.0]]])
    out, num_acc = rejection_sample(
        torch.empty(2, 0, dtype=torch.long), torch.zeros(2, dtype=torch.long), None, p,
        torch.tensor([False, True]), None,
    )
    assert out.tolist() == [[1], [2]] and num_acc.tolist() == [0, 0]


def test_greedy_shortcut_by_hand():
    vocab = 5
    argmaxes = [2, 0, 1, 3]
    target = torch.full((1, 4, vocab), 0.1)
    for j, a in enumerate(argmaxes):
        target[0, j, a] = 0.6
    greedy = torch.tensor([True])
    n = torch.tensor([3])
    for fn in (rejection_sample, rejection_sample_reference):
        out, acc = fn(torch.tensor([[2, 0, 4]]), n, None, target, greedy, None)
        assert out.tolist() == [[2, 0, 1, -1]] and acc.tolist() == [2]  # recovered
        out, acc = fn(torch.tensor([[2, 0, 1]]), n, None, target, greedy, None)
        assert out.tolist() == [[2, 0, 1, 3]] and acc.tolist() == [3]  # bonus
        out, acc = fn(torch.tensor([[0, 0, 1]]), n, None, target, greedy, None)
        assert out.tolist() == [[2, -1, -1, -1]] and acc.tolist() == [0]


@pytest.mark.parametrize("seed", range(20))
def test_greedy_verify_equals_rejection_sample_on_one_hot_p(seed):
    # The adapter's plain-greedy path must return exactly what the full path returns.
    g = torch.Generator().manual_seed(seed)
    batch, max_k, vocab = 6, 5, 7  # small vocab: drafts often hit the argmax
    argmax = torch.randint(0, vocab, (batch, max_k + 1), generator=g)
    p = torch.nn.functional.one_hot(argmax, vocab).float()
    num_draft = torch.randint(0, max_k + 1, (batch,), generator=g)
    drafts = torch.where(torch.rand(batch, max_k, generator=g) < 0.7, argmax[:, :max_k],
                         torch.randint(0, vocab, (batch, max_k), generator=g))
    drafts = torch.where(torch.arange(max_k) < num_draft.unsqueeze(1), drafts, PLACEHOLDER_TOKEN_ID)
    want, _ = rejection_sample(drafts, num_draft, None, p, torch.ones(batch, dtype=torch.bool))
    assert torch.equal(greedy_verify(drafts, num_draft, argmax), want)


def test_point_mass_rejection_recovers_from_p_without_the_draft():
    # q one-hot on token 0 and p(0) = 0: always rejected, recovered ~ p.
    size = 2000
    target = torch.tensor([[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]]).expand(size, 2, 3)
    drafts = torch.zeros(size, 1, dtype=torch.long)
    torch.manual_seed(0)
    out, acc = rejection_sample(
        drafts, torch.ones(size, dtype=torch.long), None, target,
        torch.zeros(size, dtype=torch.bool), None,
    )
    assert int(acc.sum()) == 0 and bool((out[:, 0] != 0).all())


# ------------------------------------------------------------------ seeded determinism


def test_same_seed_same_output():
    gen = torch.Generator().manual_seed(6)
    drafts, num_draft, draft, target, greedy = random_batch(gen, 32, 4, 23)
    seeds, positions = seeded(32, 500)
    torch.manual_seed(1)
    first = rejection_sample(drafts, num_draft, draft, target, greedy, seeds, positions)
    torch.manual_seed(2)    # the default generator plays no part in seeded rows
    again = rejection_sample(drafts, num_draft, draft, target, greedy, seeds, positions)
    other = rejection_sample(drafts, num_draft, draft, target, greedy, *seeded(32, 900))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])


def test_seeded_row_independent_of_batch_neighbours():
    gen = torch.Generator().manual_seed(7)
    vocab = 29
    d1, n1, q1, p1, g1 = random_batch(gen, 8, 2, vocab)
    d2, n2, q2, p2, g2 = random_batch(gen, 12, 5, vocab)
    # Row of interest: row 0 of batch 1 (K=2), sampled, 2 drafts; placed at row 7 of
    # batch 2 (K=5), with other neighbours, seeded, unseeded and greedy.
    n1[0], g1[0] = 2, False
    d1[0] = torch.multinomial(q1[0], 1)[:, 0]
    target_row = 7
    d2[target_row] = PLACEHOLDER_TOKEN_ID
    d2[target_row, :2] = d1[0]
    q2[target_row] = 0.0
    q2[target_row, :2] = q1[0]
    p2[target_row] = 1.0 / vocab
    p2[target_row, :3] = p1[0]
    n2[target_row], g2[target_row] = 2, False
    for trial in range(20):
        seeds1, pos1 = [trial] + [None] * 7, [40 + trial] + [0] * 7
        seeds2, pos2 = seeded(12, 1000 + 50 * trial)
        seeds2[3] = None
        seeds2[target_row], pos2[target_row] = trial, 40 + trial
        out1, acc1 = rejection_sample(d1, n1, q1, p1, g1, seeds1, pos1)
        out2, acc2 = rejection_sample(d2, n2, q2, p2, g2, seeds2, pos2)
        assert int(acc1[0]) == int(acc2[target_row])
        assert out1[0].tolist() == out2[target_row, :3].tolist()
        assert bool((out2[target_row, 3:] == PLACEHOLDER_TOKEN_ID).all())


def test_statistical_tests_draw_at_least_a_million_rows():
    first_token = sum(case[-1] for case in first_token_cases())
    assert first_token + JOINT_DRAWS * len(JOINT_CASES) >= 1_000_000
    assert first_token >= 1_000_000  # the first-token checks alone


def test_first_argmax_breaks_ties_like_torch_argmax():
    """The fast max(dim).indices keeps argmax's rule (lowest index among ties), on
    tie-heavy integer logits in float32 and bfloat16, -inf rows included."""
    from vllm_specdec_plugin.token_draw import first_argmax

    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        rows, vocab = int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(2, 3000, (1,), generator=g))
        x = torch.randint(0, 4, (rows, vocab), generator=g).float()
        x[0, : vocab // 2] = float("-inf")
        for dtype in (torch.float32, torch.bfloat16):
            y = x.to(dtype)
            assert torch.equal(first_argmax(y), y.argmax(dim=-1))


@pytest.mark.parametrize("name", ["rejection", "token_draw"])
def test_rejection_mathematics_needs_torch_only(name):
    """The rejection mathematics stays vLLM-free: torch, the stdlib, and each other."""
    from test_cost import imports_of

    top, ours = imports_of(name)
    assert top <= {"__future__", "collections", "dataclasses", "torch"}, top
    assert ours <= {"rejection", "token_draw"}, ours
