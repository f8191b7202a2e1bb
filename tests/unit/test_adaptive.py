"""Adaptive k: the speedup rule (``speedup``), the controller and its estimators
(``adaptive``). The cost model's fits are tested in test_step_cost.py.

Statistical tests use fixed seeds (deterministic). Their tolerances were chosen
from the estimator's spread, not tuned to the seeds: the convergence test runs with
decay 0.999 for 2000 rounds (~870 effective rounds; the standard error of α̂ at
α = 0.3 is ~0.016, so 0.05 is > 3 sigma; over seeds 0..199 the largest error seen
was 0.032). At the default decay 0.9 the window is ~10 rounds and α̂ at α = 0.3
has a standard deviation of ~0.1: fast tracking, not precision, is what it buys;
the phase-switch test checks that.
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from vllm_specdec_plugin.adaptive import AdaptiveConfig, AdaptiveK
from vllm_specdec_plugin.speedup import (batch_pays, best_k, best_net_gain, choose_source,
                                         expected_tokens, fair_ks, net_gain, speedup,
                                         step_may_pay)

pytestmark = pytest.mark.unit


def draw_accepted(rng: random.Random, alpha: float, k: int) -> int:
    """Geometric model: each draft accepted with prob. alpha until the first rejection."""
    n = 0
    while n < k and rng.random() < alpha:
        n += 1
    return n


def brute_s(alpha: float, cost: float, k_max: int, fixed: float = 0.0) -> list[Fraction]:
    """S(0..k_max) from the closed form, in exact arithmetic on the float inputs."""
    a, c, f = Fraction(alpha), Fraction(cost), Fraction(fixed)
    return [Fraction(1)] + [((1 - a ** (k + 1)) / (1 - a) if a != 1 else Fraction(k + 1))
                            / (1 + f + k * c) for k in range(1, k_max + 1)]


def brute_best_k(alpha: float, cost: float, k_max: int, min_gain: float,
                 fixed: float = 0.0) -> int:
    """argmax over the closed form, smallest k among the maxima, then the min_gain rule."""
    values = brute_s(alpha, cost, k_max, fixed)
    top = max(values)
    k_star = values.index(top)  # first index = smallest k on ties
    return k_star if top > 1 + Fraction(min_gain) else 0


def step(ak: AdaptiveK, ids: list[str], batch: int = 1) -> dict[str, tuple[int, str]]:
    """One engine step as the proposer runs it: choose, then tell whether it verifies."""
    out = ak.choose(ids, batch)
    ak.step_verifies(any(k for k, _ in out.values()))
    return out


def run_rounds(ak: AdaptiveK, rng: random.Random, alpha: float, n: int, rid: str = "r",
               batch: int = 1) -> list[int]:
    ks = []
    for _ in range(n):
        k, _ = step(ak, [rid], batch)[rid]
        ks.append(k)
        ak.observe_round(rid, k, draw_accepted(rng, alpha, k))
    return ks


def feed_linear(ak: AdaptiveK, a: float, b: float, ns=(4, 8, 16, 40, 100, 257)) -> None:
    for _ in range(5):
        for n in ns:
            ak.cost.observe_target_step(a + b * n, n)


# -- formula ---------------------------------------------------------------------

def test_expected_tokens_limits():
    for k in range(0, 33):
        assert expected_tokens(1.0, k) == k + 1
        assert expected_tokens(0.0, k) == 1.0
        assert expected_tokens(1 - 1e-12, k) == pytest.approx(k + 1, rel=1e-9)
    for k in range(1, 9):
        assert expected_tokens(1e-9, k) == pytest.approx(1 + 1e-9, rel=1e-15)
    for a in (0.0, 0.3, 0.5, 0.77, 0.999, 1.0):
        assert expected_tokens(a, 0) == 1.0


def test_expected_tokens_equals_series():
    # both branches (plain closed form below 0.5, expm1/log form above) against Σ α^i
    for i in range(0, 1000):
        a = i / 1000
        for k in (1, 2, 5, 8, 32):
            series = sum(Fraction(a) ** j for j in range(k + 1))
            assert expected_tokens(a, k) == pytest.approx(float(series), rel=1e-12)


def test_expected_tokens_rejects_bad_input():
    for a, k in ((-0.1, 2), (1.1, 2), (0.5, -1)):
        with pytest.raises(ValueError):
            expected_tokens(a, k)


def test_speedup_at_zero_drafts_is_one():
    for i in range(100):
        for c in (0.0, 0.01, 0.5, 1.0, 3.0):
            assert speedup(i / 100, 0, c) == 1.0
    assert speedup(0.5, 2, 0.25, 0.0) == pytest.approx(1.75 / 1.5)


def test_best_k_matches_brute_force_grid():
    checked = near_ties = 0
    for ai in range(100):
        a = ai / 100
        for ci in range(1, 101):
            c = ci / 100
            for k_max in (1, 4, 8):
                for g in (0.0, 0.02, 0.1):
                    got, want = best_k(a, c, k_max, g), brute_best_k(a, c, k_max, g)
                    if got != want:
                        # only float rounding at an exact tie may differ: two k with equal
                        # S, or max S equal to 1 + min_gain (e.g. α=0.53, c=0.5: S(1)=1.02)
                        s = brute_s(a, c, k_max)
                        top = max(s)
                        at_gain_edge = abs(top - 1 - Fraction(g)) <= 1e-12
                        k_tie = got > 0 and want > 0 and abs(s[got] - top) <= 1e-12 * top
                        assert at_gain_edge or k_tie, (a, c, k_max, g, got, want)
                        near_ties += 1
                    checked += 1
    assert checked == 100 * 100 * 3 * 3
    assert near_ties <= 30, near_ties  # float rounding at ties, not a systematic difference


def test_best_k_with_fixed_cost_matches_brute_force_grid():
    mismatches = 0
    for ai in range(0, 100, 3):
        for ci in range(0, 101, 4):
            for fixed in (0.05, 0.3, 1.0, 2.5):
                a, c = ai / 100, ci / 100
                got, want = best_k(a, c, 8, 0.02, fixed), brute_best_k(a, c, 8, 0.02, fixed)
                if got != want:
                    top = max(brute_s(a, c, 8, fixed))
                    assert abs(top - Fraction(1.02)) <= 1e-12 or \
                        abs(brute_s(a, c, 8, fixed)[got] - top) <= 1e-12 * top, (a, c, fixed)
                    mismatches += 1
    assert mismatches <= 5


def test_best_k_ties_and_min_gain():
    # S(0) = S(1) = 1 exactly (α = c = 0.5): the smaller k wins
    assert speedup(0.5, 1, 0.5, 0.0) == 1.0
    assert best_k(0.5, 0.5, 4, min_gain=0.0) == 0
    # S(1) = S(2) = 1.25 exactly in floats (α = 0.5, c = 0.2): the smaller k wins
    assert speedup(0.5, 1, 0.2, 0.0) == speedup(0.5, 2, 0.2, 0.0) == 1.25
    assert best_k(0.5, 0.2, 4, min_gain=0.0) == 1
    # min_gain: S(1) = 1.25 speculates at gain 0.2, not at 0.25 (strictly greater needed)
    assert best_k(0.5, 0.2, 4, min_gain=0.2) == 1
    assert best_k(0.5, 0.2, 4, min_gain=0.25) == 0
    assert best_k(0.0, 0.0, 8) == 0  # nothing accepted: E = 1 for every k
    assert best_k(0.99, 0.0, 8) == 8  # free drafts: as many as allowed


# -- acceptance estimate -----------------------------------------------------------

@pytest.mark.parametrize("alpha,cost", [(0.3, 0.15), (0.6, 0.2), (0.9, 0.05)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_alpha_converges_and_k_is_optimal(alpha, cost, seed):
    # cost chosen per α so that α ± 0.05 stays inside best_k's region (k = 1, 2, 8)
    k_true = best_k(alpha, cost, 8)
    assert k_true > 0
    for delta in (-0.05, 0.05):
        assert best_k(min(alpha + delta, 0.999), cost, 8) == k_true
    ak = AdaptiveK(AdaptiveConfig(k_max=8, c_prime_default=cost, decay=0.999))
    assert ak.cost_per_draft(1) == cost  # no step samples: c' default, v = 0
    run_rounds(ak, random.Random(seed), alpha, 2000)
    assert abs(ak.alpha("r") - alpha) < 0.05
    assert ak.choose(["r"], 1)["r"] == (k_true, "")


@pytest.mark.parametrize("seed", range(5))
def test_phase_switch_is_tracked(seed):
    # default decay 0.9: α 0.9 -> 0.2; k must fall from k_max to ~best_k(0.2) = 1
    ak = AdaptiveK(AdaptiveConfig(k_max=8, c_prime_default=0.05))
    rng = random.Random(seed)
    before = run_rounds(ak, rng, 0.9, 100)
    after = run_rounds(ak, rng, 0.2, 200)
    assert min(before[50:]) >= 6
    assert min(after[:30]) <= 3, after[:30]
    tail = after[60:]
    assert sum(tail) / len(tail) < 2.5
    assert max(tail) <= 4


def _hold(ak: AdaptiveK, rid: str = "r") -> None:
    """Reject everything until the rule holds ``rid`` at k = 0 (that choose() was step 1
    of the hold)."""
    for _ in range(100):
        k, why = step(ak, [rid])[rid]
        if k == 0:
            break
        ak.observe_round(rid, k, 0)
    assert (k, why) == (0, "adaptive")


def _hold_all(ak: AdaptiveK, ids: list[str], batch: int = 1) -> None:
    """Reject everything until the rule holds every request at k = 0."""
    for _ in range(100):
        out = step(ak, ids, batch)
        if all(k == 0 for k, _ in out.values()):
            return
        for rid, (k, _) in out.items():
            ak.observe_round(rid, k, 0)
    raise AssertionError("the rule never held every request")


def test_probing_cadence_backs_off_and_recovers():
    cfg = AdaptiveConfig(k_max=4, c_prime_default=0.05, probe_every=8, probe_max=32)
    ak = AdaptiveK(cfg)
    _hold(ak)
    # probes land on held steps 8, then 16 and 32 steps later (doubling while nobody
    # drafts by the rule), then every 32 (probe_max)
    seen = [(0, "adaptive")]
    for _ in range(8 + 16 + 32 + 32 + 31):
        k, why = step(ak, ["r"])["r"]
        seen.append((k, why))
        ak.observe_round("r", k, 0)  # probes rejected too
    probes = [j for j, kw in enumerate(seen, start=1) if kw == (1, "")]
    assert probes == [8, 24, 56, 88, 120], probes
    assert all(kw == (0, "adaptive") for j, kw in enumerate(seen, start=1) if j not in probes)
    # acceptance rises: a probe is accepted, and k > 0 comes back by the rule
    ks = []
    for _ in range(40):
        k, why = step(ak, ["r"])["r"]
        ks.append(k)
        ak.observe_round("r", k, k)
    first = next(i for i, k in enumerate(ks) if k > 0)
    assert first < 32  # the next probe (at most probe_max steps on)
    assert all(k > 0 for k in ks[first:])  # no longer held at 0 once a probe succeeds
    assert ks[-1] == 4
    # drafting by the rule resets the interval: falling back to k = 0, the first
    # probe is probe_every steps on again
    for _ in range(2):
        _hold(ak)
        again = [step(ak, ["r"])["r"][0] for _ in range(23)]  # no rounds observed
        assert again == [0] * 6 + [1] + [0] * 15 + [1]
        for _ in range(3):  # recover between probes
            ak.observe_round("r", 4, 4)
        assert step(ak, ["r"])["r"][0] > 0


def test_probes_of_held_requests_share_one_step():
    # a verifying step pays sigma once, so every held request probes in the same step
    ak = AdaptiveK(AdaptiveConfig(k_max=4, c_prime_default=0.05, probe_every=4, probe_max=64))
    ids = [f"r{i}" for i in range(6)]
    _hold_all(ak, ids)
    steps = []
    for j in range(1, 200):
        out = step(ak, ids)
        ks = {k for k, _ in out.values()}
        assert ks in ({0}, {1}), out  # all probe, or none does
        if ks == {1}:
            steps.append(j)
    assert steps == [3, 11, 27, 59, 123, 187], steps  # intervals 4 (first), 8, 16, 32, 64, 64
    # a drafting request makes probing cheap again: held ones probe every probe_every
    ak.observe_round("good", 4, 4)
    for _ in range(20):
        ak.observe_round("good", 4, 4)
    probes = []
    for _ in range(12):
        out = step(ak, ids + ["good"])
        assert out["good"][0] > 0
        probes.append(out["r0"][0])
    assert sum(probes) >= 2, probes


def test_fixed_cost_of_a_verifying_step_is_priced():
    ak = AdaptiveK(AdaptiveConfig(k_max=8, c_prime_default=0.0, probe_every=0))
    for n, t in ((1, 0.010), (2, 0.011), (1, 0.010), (3, 0.012)):
        ak.cost.observe_target_step(t, n)
    for _ in range(30):
        ak.observe_round("r", 1, 0)  # α ~ 0.2: drafts pay only if verifying is free
        ak.observe_round("r", 1, 1)
        ak.observe_round("r", 1, 0)
        ak.observe_round("r", 1, 0)
        ak.observe_round("r", 1, 0)
    assert ak.fixed_cost(1) == 0.0
    assert ak.choose(["r"], 1)["r"][0] > 0
    ak.cost.observe_spec_overhead(0.5)  # the first call pays one-time set-up: skipped
    assert ak.fixed_cost(1) == 0.0
    ak.cost.observe_spec_overhead(0.003)  # the exact sampler: 0.3 plain steps at batch 1
    assert ak.fixed_cost(1) == pytest.approx(0.003 / ak.cost.step_time(1))
    ak.cost.observe_spec_overhead(0.4)  # one slow step does not move the median
    ak.cost.observe_spec_overhead(0.003)
    assert ak.fixed_cost(1) == pytest.approx(0.003 / ak.cost.step_time(1))
    assert ak.choose(["r"], 1)["r"] == (0, "adaptive")
    with pytest.raises(ValueError):
        ak.cost.observe_spec_overhead(-1.0)


def test_batch_pays_charges_the_fixed_cost_to_every_row():
    # One row at α 0.6 with 3 free n-gram drafts pays on its own (S = 2.18 / 1.1)...
    row = (0.6, 3, 0.0)
    assert speedup(*row[:2], row[2], 0.1) > 1.02 and batch_pays([row], 1, 0.1)
    # ...but not in a batch of 16, where σ = 0.1 slows all 16 rows for 1.18 more tokens
    assert not batch_pays([row], 16, 0.1)
    assert batch_pays([row] * 2, 16, 0.1)  # 2.35 tokens on 16 rows: +14.7 % > +12.2 %
    # every row drafting alike: the per-row rule, exactly
    for alpha, k, cost, fixed in ((0.5, 2, 0.1, 0.2), (0.8, 4, 0.05, 0.3), (0.3, 1, 0.2, 0.0)):
        want = speedup(alpha, k, cost, fixed) > 1.02
        assert batch_pays([(alpha, k, cost)] * 8, 8, fixed) is want
    assert not batch_pays([], 4, 0.0)
    # the draft cost per token counts, shared over the batch like σ
    assert batch_pays([(0.9, 4, 0.0)], 4, 0.0)
    assert not batch_pays([(0.9, 4, 1.0)], 4, 0.0)


def test_no_row_is_slowed_by_more_than_the_slack():
    """fair_ks: beside a row without drafts the step may grow by at most the slack
    (in plain steps), spent on the positions worth most per cost; with every row
    drafting, a step within slack of every row's E[N] keeps all; probes of the rule:
    any kept set leaves every row's time per token within 1 + slack."""
    # 16 rows, one drafts 3 n-gram tokens at cost 0.8 (a CPU: a token costs ~a row)
    row = (0.9, 3, 0.8)
    assert fair_ks([row], 16, 0.0, 0.05) == [1]  # 0.8/16 = 0.05: one token fits
    assert fair_ks([row], 16, 0.02, 0.05) == [0]  # σ leaves 0.03·16 = 0.48 < 0.8
    assert fair_ks([row], 1, 0.0, 0.05) == [3]  # alone it is its own bound: 3.44/3.4
    # every row drafting: kept when each row gains more than the step costs
    assert fair_ks([(0.9, 4, 0.5)] * 4, 4, 0.0, 0.05) == [4] * 4
    # the likeliest positions go first: α 0.9 before α 0.3
    assert fair_ks([(0.3, 2, 0.4), (0.9, 2, 0.4)], 26, 0.0, 0.05) == [1, 2]  # 1.3: 3 fit
    assert fair_ks([], 8, 0.0, 0.05) == [] and fair_ks([(0.5, 0, 0.1)], 8, 0.0, 0.05) == [0]
    rng = random.Random(3)
    for _ in range(500):
        batch, fixed, slack = rng.randint(1, 32), rng.random() * 0.1, rng.random() * 0.2
        rows = [(rng.random(), rng.randint(0, 8), rng.random()) for _ in range(rng.randint(1, batch))]
        ks = fair_ks(rows, batch, fixed, slack)
        assert all(0 <= k <= r[1] for k, r in zip(ks, rows))
        if not any(ks):
            continue
        step = 1 + fixed + sum(k * c for k, (_, _, c) in zip(ks, rows)) / batch
        gains = [expected_tokens(a, k) for k, (a, _, _) in zip(ks, rows)]
        if len(rows) < batch:
            gains.append(1.0)  # a row that drafts nothing
        assert step <= (1 + slack) * min(gains) + 1e-9


def test_saved_slack_lets_a_row_be_slowed_more_and_debt_less():
    """fair_ks with row_credit's credits: row r may take F <= (1 + slack)·E[N_r] +
    credit_r; a row without drafts bounds the step at 1 + slack + its credit."""
    row = (0.9, 3, 0.8)  # 16 rows, one drafts: F = 1 + 2.4 / 16 = 1.15 with all 3
    assert fair_ks([row], 16, 0.0, 0.05, [0.0], 0.15) == [3]  # idle rows saved 0.15
    assert fair_ks([row], 16, 0.0, 0.05, [0.5], 0.05) == [2]  # 0.1·16 = 1.6: 2 fit
    assert fair_ks([row], 16, 0.0, 0.05, [0.0], 0.05) == [1]  # the row itself: as before
    assert fair_ks([row], 16, 0.0, 0.05, [0.5], -0.05) == [0]  # an idle row owes: none
    rng = random.Random(4)
    for _ in range(500):
        batch, fixed, slack = rng.randint(1, 32), rng.random() * 0.1, rng.random() * 0.2
        rows = [(rng.random(), rng.randint(0, 8), rng.random()) for _ in range(rng.randint(1, batch))]
        credits = [rng.uniform(-1, 1) for _ in rows]
        idle = rng.uniform(-1, 1)
        ks = fair_ks(rows, batch, fixed, slack, credits, idle)
        assert all(0 <= k <= r[1] for k, r in zip(ks, rows))
        if not any(ks):
            continue
        step = 1 + fixed + sum(k * c for k, (_, _, c) in zip(ks, rows)) / batch
        bounds = [(1 + slack) * expected_tokens(a, k) + cr
                  for k, (a, _, _), cr in zip(ks, rows, credits)]
        if len(rows) < batch:
            bounds.append(1 + slack + idle)  # a row that drafts nothing
        assert step <= min(bounds) + 1e-9


def test_row_credit_books_each_decode_step():
    from types import SimpleNamespace

    from vllm_specdec_plugin.row_credit import settle
    from vllm_specdec_plugin.tuning import CREDIT_MAX

    reqs = {r: SimpleNamespace(credit=0.0) for r in "abc"}
    settle([[1], [1], []], ["a", "b", "c"], reqs, 1.0, 0.05)  # a plain step: + slack
    assert reqs["a"].credit == reqs["b"].credit == pytest.approx(0.05)
    assert reqs["c"].credit == 0.0  # took no part (prefilling)
    settle([[1, 2], [1], []], ["a", "b", "c"], reqs, 1.3, 0.05)  # a gained a token
    assert reqs["a"].credit == pytest.approx(0.05 + 2.1 - 1.3)
    assert reqs["b"].credit == pytest.approx(0.05 + 1.05 - 1.3)  # slowed beside: owes
    for _ in range(100):
        settle([[1]], ["a"], reqs, 1.0, 0.05)
    assert reqs["a"].credit == CREDIT_MAX
    settle([[1]], ["b"], reqs, 9.0, 0.05)
    assert reqs["b"].credit == -CREDIT_MAX
    settle([[1]], ["gone"], reqs, 1.0, 0.05)  # unknown requests are skipped


def test_fair_cuts_plans_to_a_prefix_and_counts_the_rows_left_without_drafts():
    """batch_check.fair on planned rows: n-gram drafts keep a prefix, a draft-model
    plan a smaller k, a plan cut to nothing is dropped and counted; probe steps and a
    large slack keep everything."""
    from types import SimpleNamespace

    from vllm_specdec_plugin import batch_check

    def plans(credit=0.0):
        return [SimpleNamespace(catch_up=0.0, req_id="ng", k=3, drafts=[7, 8, 9], alpha=0.95,
                                req=SimpleNamespace(credit=credit)),
                SimpleNamespace(catch_up=0.0, req_id="dm", k=4, drafts=[], alpha=None,
                                req=SimpleNamespace(credit=credit)),
                SimpleNamespace(catch_up=0.0, req_id="lo", k=2, drafts=[5, 6], alpha=0.2,
                                req=SimpleNamespace(credit=credit))]

    # 16 rows (13 without drafts); a draft token costs 0.2 plain steps / 16 rows
    est = {"ngram": (lambda rid, m=None: 0.5, 0.2, 0.0), "draft": (lambda rid: 0.7, 0.2, 0.0)}
    kept, cut = batch_check.fair(plans(), 16, est, probing=False, slack=0.05)
    # 0.05 · 16 / 0.2 = 4 positions: ng 0.95, 0.90, 0.86, then dm 0.7; "lo" (0.2) is cut
    assert [(p.req_id, p.k, p.drafts) for p in kept] == [("ng", 3, [7, 8, 9]), ("dm", 1, [])]
    assert cut == 1
    kept, cut = batch_check.fair(plans(), 16, est, probing=True, slack=0.05)
    assert [p.k for p in kept] == [3, 4, 2] and cut == 0
    kept, cut = batch_check.fair(plans(), 16, est, probing=False, slack=1000.0)
    assert [p.k for p in kept] == [3, 4, 2] and cut == 0
    # credit: every row saved 0.05 plain steps (the 13 idle ones too): 8 positions fit
    ps = plans(0.05)
    idle = [SimpleNamespace(credit=0.05) for _ in range(13)]
    kept, cut = batch_check.fair(ps, 16, est, probing=False, slack=0.05,
                                 states=[p.req for p in ps] + idle)
    assert [p.k for p in kept] == [3, 4, 1] and cut == 0
    idle[0].credit = -0.05  # one idle row owes what the others saved: nothing fits
    kept, cut = batch_check.fair(plans(0.05), 16, est, probing=False, slack=0.05, states=idle)
    assert kept == [] and cut == 3
    assert batch_check.fair([], 4, est, probing=False) == ([], 0)


def test_plans_cut_for_the_row_bound_must_still_pay_the_step_min_gain():
    """batch_check.check: fair's cut first, then pays on what is left at the step's
    min_gain (S_batch > 1 + min_gain, all rows counted); a plan set that paid whole
    but not once cut is dropped and counted apart from the cut."""
    from types import SimpleNamespace

    from vllm_specdec_plugin import batch_check

    def plans():
        return [SimpleNamespace(catch_up=0.0, req_id="ng", k=3, drafts=[7, 8, 9], alpha=0.95,
                                req=SimpleNamespace(credit=0.0)),
                SimpleNamespace(catch_up=0.0, req_id="dm", k=4, drafts=[], alpha=None,
                                req=SimpleNamespace(credit=0.0)),
                SimpleNamespace(catch_up=0.0, req_id="lo", k=2, drafts=[5, 6], alpha=0.2,
                                req=SimpleNamespace(credit=0.0))]

    est = {"ngram": (lambda rid, m=None: 0.5, 0.2, 0.0), "draft": (lambda rid: 0.7, 0.2, 0.0)}
    # cut as in the test above to ng 3 + dm 1: S = (1 + (2.71 + 0.7) / 16) / (1 + 0.8 / 16)
    s_cut = (1 + (expected_tokens(0.95, 3) - 1 + 0.7) / 16) / (1 + 4 * 0.2 / 16)
    assert 1.15 < s_cut < 1.16
    kept, cut, unpaid = batch_check.check(plans(), 16, est, False, 0.05, 0.15, [])
    assert [(p.req_id, p.k) for p in kept] == [("ng", 3), ("dm", 1)] and (cut, unpaid) == (1, 0)
    kept, cut, unpaid = batch_check.check(plans(), 16, est, False, 0.05, 0.16, [])
    assert kept == [] and (cut, unpaid) == (1, 2)
    # uncut, the whole set pays 1.16: the cut, not the threshold alone, dropped it
    whole = plans()
    assert batch_check.pays(whole, 16, est, False, 0.16)
    # a probe step keeps everything whatever the threshold
    kept, cut, unpaid = batch_check.check(plans(), 16, est, True, 0.05, 10.0, [])
    assert [p.k for p in kept] == [3, 4, 2] and (cut, unpaid) == (0, 0)


def test_step_bound_holds_every_plan_the_batch_check_could_see():
    """best_net_gain is the max of net_gain over k (brute force), and a step whose
    bound misses never has a set of plans (any row subset, any k up to each row's
    cap) that batch_pays accepts; where the bound passes, the capped plans do."""
    rng = random.Random(7)
    for _ in range(300):
        alpha, cost, k_max = rng.random(), rng.random() * 0.3, rng.randint(1, 8)
        want = max([0.0] + [net_gain(alpha, k, cost) for k in range(1, k_max + 1)])
        assert best_net_gain(alpha, k_max, cost) == pytest.approx(want, abs=1e-12)
    for _ in range(300):
        batch, fixed = rng.randint(1, 32), rng.random() * 0.4
        caps = [(rng.random(), rng.randint(1, 8), rng.random() * 0.2)
                for _ in range(rng.randint(1, batch))]
        bound_ok = step_may_pay([best_net_gain(a, k, c) for a, k, c in caps], batch, fixed)
        for _ in range(20):  # random plans within the caps
            plans = [(a, rng.randint(1, k), c) for a, k, c in caps if rng.random() < 0.7]
            if not bound_ok:
                assert not batch_pays(plans, batch, fixed)
        best = [(a, max(range(1, k + 1), key=lambda j: net_gain(a, j, c)), c) for a, k, c in caps]
        best = [r for r in best if net_gain(*r) > 0]
        assert batch_pays(best, batch, fixed) is bound_ok
    assert not step_may_pay([], 4, 0.0) and not step_may_pay([0.0, 0.0], 2, 0.0)


def test_a_probe_step_is_flagged_and_does_not_reset_the_interval():
    ak = AdaptiveK(AdaptiveConfig(k_max=4, c_prime_default=0.05, probe_every=4, probe_max=64))
    _hold(ak)
    flags = []
    for _ in range(4 + 8 + 16):
        out = step(ak, ["r"])
        flags.append(ak.probing)
        assert ak.probing is (out["r"] == (1, ""))
        ak.observe_round("r", out["r"][0], 0)
    assert [i for i, f in enumerate(flags, start=2) if f] == [4, 12, 28]  # doubling


def test_a_paying_probe_the_batch_does_not_follow_backs_off():
    """Each probe lifts one held row past the rule (pooled acceptance pays per row).
    If the caller lets lifted rows draft, probing stays at probe_every; if every step
    after a probe verifies nothing (its batch check vetoed the lifted rows), the
    interval doubles as for a probe that did not pay."""
    def probe_steps(batch_lets_them_draft: bool) -> list[int]:
        ak = AdaptiveK(AdaptiveConfig(k_max=4, c_prime_default=0.05, probe_every=4,
                                      probe_max=64))
        ids = [f"r{i}" for i in range(8)]
        _hold_all(ak, ids, 8)
        probes, drafting = [], set()
        for j in range(1, 64):
            out = ak.choose(ids, 8)
            by_rule = {rid for rid, (k, _) in out.items() if k > 0}
            if ak.probing:
                probes.append(j)
                for i, rid in enumerate(sorted(by_rule - drafting)):
                    ak.observe_round(rid, 1, 1 if i == 0 else 0)  # one accepted
                ak.step_verifies(True)
            else:
                drafting = by_rule
                ak.step_verifies(bool(by_rule) and batch_lets_them_draft)
        assert drafting, "the accepted probes lift rows past the rule"
        return probes

    assert probe_steps(True) == [3, 7, 11, 15, 19, 23, 27]  # lifted rows draft
    assert probe_steps(False) == [3, 11, 27, 59]  # the batch vetoes them: doubling


def test_best_k_with_a_fixed_cost_looks_past_k1():
    # S(1) < 1 = S(0) < S(k*): the walk must not stop at k = 1
    alpha, cost, fixed = 0.95, 0.02, 1.0
    assert speedup(alpha, 1, cost, fixed) < 1.0
    k = best_k(alpha, cost, 8, 0.02, fixed)
    assert k > 1 and speedup(alpha, k, cost, fixed) > 1.02
    values = [speedup(alpha, j, cost, fixed) for j in range(9)]
    assert k == max(range(1, 9), key=lambda j: (values[j], -j))
    assert speedup(alpha, 0, cost, fixed) == 1.0


def test_new_requests_start_at_global_prior_and_forget():
    ak = AdaptiveK(AdaptiveConfig(k_max=4, prior_alpha=0.7))
    assert ak.alpha("new") == pytest.approx(0.7)
    assert ak.snapshot()["global_alpha"] == pytest.approx(0.7)
    for _ in range(20):
        ak.observe_round("bad", 4, 0)
        ak.observe_round("good", 4, 4)
    g = ak.snapshot()["global_alpha"]
    assert g != pytest.approx(0.7)
    assert ak.alpha("new") == g
    assert ak.alpha("bad") < g < ak.alpha("good") <= 0.999
    assert ak.snapshot()["tracked_requests"] == 2
    ak.forget("bad")
    assert ak.alpha("bad") == ak.global_alpha()
    assert ak.snapshot()["tracked_requests"] == 1
    ak.forget("never-seen")  # no error
    # rounds without drafts carry no information
    before = ak.alpha("good")
    ak.observe_round("good", 0, 0)
    assert ak.alpha("good") == before
    with pytest.raises(ValueError):
        ak.observe_round("good", 2, 3)


def test_global_alpha_decays_once_per_engine_step():
    # the global window is counted in steps (choose() calls), not in rounds, so a
    # large batch does not wash it out within one step
    cfg = AdaptiveConfig(k_max=4, prior_alpha=0.6, prior_weight=4.0, decay=0.5)
    ak = AdaptiveK(cfg)
    ids = [f"r{i}" for i in range(4)]
    ak.choose(ids, 4)
    for r in ids:
        ak.observe_round(r, 4, 4)  # 4 successes / 4 trials each
    ak.choose(ids, 4)
    for r in ids:
        ak.observe_round(r, 4, 0)  # 0 successes / 1 trial each
    succ, trials = 0.5 * 16 + 0, 0.5 * 16 + 4
    assert ak.global_alpha() == pytest.approx((4 * 0.6 + succ) / (4 + trials))
    # per request: decay per own round, prior = the global estimate
    g = ak.global_alpha()
    assert ak.alpha("r0") == pytest.approx((4 * g + 0.5 * 4) / (4 + 0.5 * 4 + 1))


def test_alpha_clamped():
    ak = AdaptiveK(AdaptiveConfig(k_max=8, prior_alpha=1.0))
    for _ in range(50):
        ak.observe_round("r", 8, 8)
    assert ak.alpha("r") == 0.999
    assert ak.global_alpha() == 0.999


# -- load ---------------------------------------------------------------------------

def _loaded(a: float, b: float, prior_alpha: float, probe_every: int = 8) -> AdaptiveK:
    ak = AdaptiveK(AdaptiveConfig(k_max=8, prior_alpha=prior_alpha, probe_every=probe_every))
    feed_linear(ak, a, b)
    for m in (1, 8, 64, 256):  # draft forward = 0.1 target step at the same batch
        ak.cost.observe_draft_step(2 * 0.1 * (a + b * m), 2, 2 * m)
    return ak


def test_load_switches_speculation_off():
    ak = _loaded(0.02, 2e-5, prior_alpha=0.8)  # big fixed overhead, small per-token cost
    ids = [f"r{i}" for i in range(4)]
    small = ak.choose(ids, 4)
    assert all(k > 0 and why == "" for k, why in small.values())
    assert ak.cost.load_cost(4) < 0.01
    big = 20000  # v(B) ~ 0.95: not even α = 0.999 pays for a draft
    held, probe = {r: (0, "load") for r in ids}, {r: (1, "") for r in ids}
    # load probes: every row k = 1 after 8 steps under load, then 16, 32 ... probe_max
    seen = [ak.choose(ids, big) for _ in range(8 + 16 + 32 + 64 + 128 + 128)]
    probes = [j for j, out in enumerate(seen, start=1) if out == probe]
    assert probes == [8, 24, 56, 120, 248, 376], probes
    assert all(out == held for j, out in enumerate(seen, start=1) if j not in probes)
    assert ak.choose(ids, 4) == small  # load gone: back to speculating
    assert ak.choose(ids, big) == held  # a new spell of load starts at probe_every again
    ak.cfg.load_probe_every = 0  # 0: never
    assert all(ak.choose(ids, big) == held for _ in range(3 * 128))


def test_a_load_probe_revises_a_fit_that_reads_every_token_as_a_row():
    """The "load" verdict rests on the fit; a fit whose intercept collapsed (T = b·n)
    holds every row at any α, and without probes no verifying step could revise it.
    A load probe verifies B more tokens; its true time lifts the hold."""
    ak = AdaptiveK(AdaptiveConfig(k_max=8, prior_alpha=0.8))
    ids = [f"r{i}" for i in range(8)]
    for n in (1, 2, 4, 8) * 4:  # a misleading start: time proportional to tokens
        ak.cost.observe_target_step(0.01 * n, n)
    assert ak.cost.load_cost(8) > 0.99
    true_t = lambda n: 0.06 + 0.001 * n  # what a step really costs
    outs, flags = [], []
    for _ in range(40):
        out = ak.choose(ids, 8)
        outs.append(out)
        flags.append((ak.load_probing, ak.probing))
        n = 8 + sum(k for k, _ in out.values())
        ak.cost.observe_target_step(true_t(n), n)
        for rid, (k, _) in out.items():
            ak.observe_round(rid, k, k)
    first = next(j for j, out in enumerate(outs) if out != {r: (0, "load") for r in ids})
    assert outs[first] == {r: (1, "") for r in ids}  # the load probe
    assert first == 7  # load_probe_every steps under load
    assert flags[first] == (True, True) and flags.count((True, True)) == 1
    assert ak.probing is False and ak.cost.load_cost(8) < 0.2
    assert all(k > 1 for k, why in outs[-1].values())  # speculating by the rule again


@pytest.mark.parametrize("a,b", [(0.02, 2e-5), (0.01, 5e-4)])
@pytest.mark.parametrize("prior_alpha", [0.3, 0.6, 0.9, 0.999])
def test_k_non_increasing_in_batch(a, b, prior_alpha):
    ak = _loaded(a, b, prior_alpha, probe_every=0)  # the rule alone, no probe steps
    ak.cfg.load_probe_every = 0
    ks, reasons = [], []
    for batch in range(1, 257):
        k, why = ak.choose([f"q{batch}"], batch)[f"q{batch}"]
        ks.append(k)
        reasons.append(why)
    assert all(x >= y for x, y in zip(ks, ks[1:])), ks
    if "load" in reasons:  # once load switches speculation off it stays off as B grows
        first = reasons.index("load")
        assert all(r == "load" for r in reasons[first:])
    if b == 5e-4:  # v(256) ~ 0.93: this profile reaches "load" inside 1..256
        assert reasons[-1] == "load"
        assert ks[0] > 0 or prior_alpha == 0.3


# -- config ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,field", [
    ({"k_max": 0}, "k_max"), ({"k_max": 33}, "k_max"), ({"k_max": 4.0}, "k_max"),
    ({"k_max": True}, "k_max"),
    ({"prior_alpha": -0.1}, "prior_alpha"), ({"prior_alpha": 1.5}, "prior_alpha"),
    ({"prior_weight": 0}, "prior_weight"),
    ({"decay": 0}, "decay"), ({"decay": 1.5}, "decay"),
    ({"min_gain": -0.01}, "min_gain"),
    ({"probe_every": -1}, "probe_every"), ({"probe_every": 2.5}, "probe_every"),
    ({"c_prime_default": -1}, "c_prime_default"),
    ({"ema": 0}, "ema"), ({"ema": 1.1}, "ema"),
    ({"fit_decay": 0}, "fit_decay"),
])
def test_config_validation(kwargs, field):
    args = {"k_max": 4, **kwargs}
    with pytest.raises(ValueError, match=field):
        AdaptiveConfig(**args)


def test_config_defaults_valid():
    c = AdaptiveConfig(k_max=32)
    assert (c.prior_alpha, c.prior_weight, c.decay, c.min_gain, c.probe_every,
            c.c_prime_default, c.ema) == (0.6, 4.0, 0.9, 0.02, 8, 0.05, 0.2)
    AdaptiveConfig(k_max=1, probe_every=0, decay=1.0, min_gain=0.0)


# ------------------------------------------------------------- source choice (hybrid)


def test_choose_source_takes_the_larger_predicted_speedup():
    # Fresh request, default costs: 2 n-gram drafts (free) beat the model at k = 4 ...
    cands = {"ngram": (0.6, 2, 0.0, 0.0), "draft": (0.6, 4, 0.05, 0.0)}
    assert choose_source(cands, 0.02, allow_none=True) == ("ngram", 2)
    # ... 1 n-gram draft does not (1.6 < 2.31 / 1.2).
    cands["ngram"] = (0.6, 1, 0.0, 0.0)
    assert choose_source(cands, 0.02, allow_none=True) == ("draft", 4)
    # A request whose n-gram drafts keep failing goes to the model even with 4 of them.
    cands = {"ngram": (0.1, 4, 0.0, 0.0), "draft": (0.8, 4, 0.05, 0.0)}
    assert choose_source(cands, 0.02, allow_none=True) == ("draft", 4)
    # ... and the other way round.
    cands = {"ngram": (0.9, 3, 0.0, 0.0), "draft": (0.3, 4, 0.05, 0.0)}
    assert choose_source(cands, 0.02, allow_none=True) == ("ngram", 3)


def test_choose_source_backs_off_only_when_allowed():
    # Under load (v(B) ~ 1) nothing pays: none when adaptive ...
    cands = {"ngram": (0.5, 2, 0.9, 0.0), "draft": (0.5, 4, 0.95, 0.0)}
    assert speedup(0.5, 2, 0.9, 0.0) < 1.0 and speedup(0.5, 4, 0.95, 0.0) < 1.0
    assert choose_source(cands, 0.02, allow_none=True) == ("none", 0)
    # ... the better of the two with a fixed k (the user asked for drafts).
    assert choose_source(cands, 0.02, allow_none=False) == ("ngram", 2)
    assert choose_source({}, 0.02, allow_none=False) == ("none", 0)
    # Ties go to the first candidate (n-gram is offered first: it costs no draft time).
    assert choose_source({"ngram": (0.5, 2, 0.0, 0.0), "draft": (0.5, 2, 0.0, 0.0)}, 0.0, True) == ("ngram", 2)
