"""The step policy (``control.policy``): ``decide`` against brute force and its bounds,
the hint the scheduler applies it with (``verify_cap``, ``keep``, and the cut in
``compat.scheduler``), the probe schedule and the host-time term; with the two
ledgers they read (``RequestState.settle``, ``step_record.saved_seconds``).

Units are the policy's: tokens, and plain steps (a step without drafts = 1).
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from types import SimpleNamespace

import pytest

from vllm_specdec_plugin.compat import scheduler as sched
from vllm_specdec_plugin.control.acceptance import expected_tokens
from vllm_specdec_plugin.control.policy import (Decision, Hint, Offer, PlanningCost,
                                                ProbeSchedule, RowView, StepView, decide, keep,
                                                verify_cap)
from vllm_specdec_plugin.request_state import RequestState, keep_scheduled
from vllm_specdec_plugin.step_record import saved_seconds
from vllm_specdec_plugin.tuning import (CREDIT_MAX, HOST_DECAY, HOST_MIN_STEPS, MIN_GAIN,
                                        PROBE_EVERY, PROBE_MAX)

pytestmark = pytest.mark.unit

HUGE = 1e9  # a tpot_limit that never binds


def _offer(row: RowView, source: str) -> Offer:
    return next(o for o in row.offers if o.source == source)


def step_of(view: StepView, rows: list[RowView], d: Decision):
    """(E, F, E[N] per row, first-token spend) of a decision, computed from its ks."""
    e, f, spent, per_row = float(view.batch), 1.0, 0.0, []
    for r, (src, k) in zip(rows, d.ks):
        if k:
            o = _offer(r, src)
            assert 1 <= k <= o.k
            e += expected_tokens(o.alpha, k) - 1.0
            f += k * (view.verify + o.cost) + o.once
            spent += k * (view.verify + o.cost) + o.now
            per_row.append(expected_tokens(o.alpha, k))
        else:
            per_row.append(1.0)
    if any(k for _, k in d.ks):
        f += view.sigma
        spent += view.sigma
    return e, f, per_row, spent


def goodput(view: StepView, rows: list[RowView], ks) -> float:
    """E / F of taking the first ks[r] drafts of each row's (only) offer."""
    e, f = float(view.batch), 1.0 + (view.sigma if any(ks) else 0.0)
    for r, k in zip(rows, ks):
        if k:
            o = r.offers[0]
            e += expected_tokens(o.alpha, k) - 1.0
            f += k * (view.verify + o.cost) + o.once
    return e / f


def brute_force(view: StepView, rows: list[RowView]):
    """The best goodput over every non-empty choice of a prefix per row, and its ks."""
    best, best_ks = None, None
    for ks in itertools.product(*(range(r.offers[0].k + 1) for r in rows)):
        if any(ks):
            g = goodput(view, rows, ks)
            if best is None or g > best:
                best, best_ks = g, ks
    return best, best_ks


def _random_rows(rng: random.Random, n: int, once: bool = False) -> list[RowView]:
    return [RowView([Offer(rng.choice(("ngram", "draft")), rng.uniform(0.02, 0.98),
                           rng.randint(1, 3), rng.uniform(0.0, 0.3),
                           once=rng.uniform(0.0, 1.0) if once else 0.0)])
            for _ in range(n)]


# -- decide: the objective -------------------------------------------------------------

@pytest.mark.parametrize("once", [False, True])
def test_decide_is_the_brute_force_optimum_of_goodput_when_no_bound_binds(once):
    """2-3 rows, k <= 3, σ sometimes, a round cost (a catch-up) or none: decide's E / F
    equals the best over all prefix choices per row; it verifies exactly when that
    best beats a plain step (E / F = B) by MIN_GAIN."""
    rng = random.Random(0)
    verified = held = 0
    for _ in range(1500):
        n = rng.randint(2, 3)
        view = StepView(n + rng.randint(0, 3), rng.uniform(0.01, 0.5),
                        rng.choice((0.0, rng.uniform(0.0, 0.3))), tpot_limit=HUGE)
        rows = _random_rows(rng, n, once)
        d = decide(view, rows)
        ks = [k for _, k in d.ks]
        best, best_ks = brute_force(view, rows)
        if best <= view.batch * (1 + MIN_GAIN):
            assert not any(ks) and d.order == [], (view, rows, best_ks)
            held += 1
            continue
        assert any(ks), (view, rows, best_ks, best / view.batch)
        assert goodput(view, rows, ks) == pytest.approx(best, rel=1e-12), (view, rows, ks, best_ks)
        assert [src for src, _ in d.ks] == [r.offers[0].source if k else ""
                                            for r, k in zip(rows, ks)]
        verified += 1
    assert verified > (20 if once else 100) and held > 100  # both sides were exercised


def test_a_round_cost_is_weighed_against_the_prefix_that_pays_it_best():
    """B = 2: row 0's first position alone is worth 0.73 at 0.42 plain steps (1.75 <
    E/F = 2), but its first three are worth 1.65 at 0.53: E/F 2.38, 1.19x a plain step.
    A row's first candidate is that prefix, so the step verifies it."""
    view = StepView(2, 0.0213, 0.0, tpot_limit=HUGE)
    rows = [RowView([Offer("draft", 0.7289, 3, 0.0363, once=0.3594)]),
            RowView([Offer("draft", 0.6662, 3, 0.1988, once=0.1105)])]
    best, best_ks = brute_force(view, rows)
    assert best_ks == (3, 0) and best > 1.15 * view.batch
    d = decide(view, rows)
    assert goodput(view, rows, [k for _, k in d.ks]) == pytest.approx(best)


def test_the_greedy_with_round_costs_still_only_verifies_what_beats_a_plain_step():
    """With once > 0, whatever it verifies beats a plain step by MIN_GAIN, and never
    beats the brute force."""
    rng = random.Random(1)
    for _ in range(2000):
        n = rng.randint(2, 3)
        view = StepView(n + rng.randint(0, 3), rng.uniform(0.01, 0.5),
                        rng.choice((0.0, rng.uniform(0.0, 0.3))), tpot_limit=HUGE)
        rows = _random_rows(rng, n, once=True)
        ks = [k for _, k in decide(view, rows).ks]
        if any(ks):
            g = goodput(view, rows, ks)
            assert view.batch * (1 + MIN_GAIN) < g <= brute_force(view, rows)[0] * (1 + 1e-12)


def _best_k(alpha: float, cost: float, k_max: int, sigma: float):
    """One row alone (B = 1): the goodput of each k from the closed form, the argmax
    (smallest k among ties), and that k or 0 by the MIN_GAIN rule."""
    values = [1.0] + [expected_tokens(alpha, k) / (1 + sigma + k * cost)
                      for k in range(1, k_max + 1)]
    top = max(values[1:])
    k = values.index(top, 1)
    return values, (k if top > 1 + MIN_GAIN else 0)


def test_one_row_alone_gets_the_best_k_on_a_grid():
    """B = 1 on a grid of α, position cost, k ceiling and σ: decide's k is the argmax of
    E[N](α, k) / (1 + σ + k·c) (0 unless it beats a plain step by MIN_GAIN); only float
    rounding at an exact tie may differ."""
    checked = near_ties = 0
    for ai in range(0, 100, 3):
        for ci in range(1, 101, 3):
            for k_max in (1, 4, 8):
                for sigma in (0.0, 0.05, 0.3, 1.0):
                    a, c = ai / 100, ci / 100
                    d = decide(StepView(1, c, sigma, tpot_limit=HUGE),
                               [RowView([Offer("draft", a, k_max)])])
                    got = d.ks[0][1]
                    values, want = _best_k(a, c, k_max, sigma)
                    checked += 1
                    if got != want:
                        top = max(values[1:])
                        at_gain_edge = abs(top - 1 - MIN_GAIN) <= 1e-12
                        k_tie = got and want and abs(values[got] - top) <= 1e-12 * top
                        assert at_gain_edge or k_tie, (a, c, k_max, sigma, got, want)
                        near_ties += 1
    assert checked == 34 * 34 * 3 * 4 and near_ties <= 10


def test_one_row_ties_free_drafts_and_a_verify_cost_that_hides_k1():
    one = lambda a, c, k=4, sigma=0.0: decide(  # noqa: E731
        StepView(1, c, sigma, tpot_limit=HUGE), [RowView([Offer("draft", a, k)])]).ks[0][1]
    assert one(0.5, 0.5) == 0    # S(1) = 1.5 / 1.5 = 1: a plain step is as good
    assert one(0.5, 0.2) == 1    # S(1) = S(2) = 1.25: the smaller k
    assert one(0.0, 0.0) == 0    # nothing accepted
    assert one(0.99, 0.0, 8) == 8  # free drafts: as many as allowed
    # σ 1.0: S(1) = 1.95 / 2.02 < 1 = S(0) < S(k*): the greedy looks past k = 1
    alpha, cost, sigma = 0.95, 0.02, 1.0
    assert expected_tokens(alpha, 1) / (1 + sigma + cost) < 1.0
    k = one(alpha, cost, 8, sigma)
    assert k == _best_k(alpha, cost, 8, sigma)[1] > 1


def test_a_step_that_does_not_beat_a_plain_step_by_min_gain_verifies_nothing():
    """B = 1, a position at 0.5 plain steps: α 0.51 raises E / F to 1.007 only (held);
    α 0.6 to 1.067 (verifies). A row held so is "batch" where its positions would pay
    for a step of its own (E[N] / (1 + σ + B·its cost) > 1 + MIN_GAIN: the rest of the
    batch made the step not pay), else "adaptive"."""
    low = decide(StepView(1, 0.5, 0.0), [RowView([Offer("ngram", 0.51, 1)])])
    assert low == Decision([("", 0)], ["adaptive"], [])
    high = decide(StepView(1, 0.5, 0.0), [RowView([Offer("ngram", 0.6, 1)])])
    assert high == Decision([("ngram", 1)], [""], [0])
    # B = 8, σ 0.05: one row at α 0.5 and 0.02 a position would pay on its own (1.5 /
    # 1.21 = 1.24) but the batch gains 8.5 / 1.07 = 7.94 < 8.16 tokens a plain step
    rows = [RowView([Offer("ngram", 0.5, 1)])] + [RowView([]) for _ in range(7)]
    d = decide(StepView(8, 0.02, 0.05, tpot_limit=HUGE), rows)
    assert d == Decision([("", 0)] * 8, ["batch"] + ["no_offer"] * 7, [])
    assert decide(StepView(4, 0.02, 0.05, tpot_limit=HUGE), rows[:4]).ks[0] == ("ngram", 1)
    # a row priced out by the ratio rule keeps its own reason; rows without offers theirs
    rows = [RowView([Offer("ngram", 0.51, 1)]), RowView([Offer("draft", 0.01, 2)]),
            RowView([]), RowView([Offer("ngram", 0.9, 0)])]
    d = decide(StepView(4, 0.5, 0.0), rows)
    assert d.ks == [("", 0)] * 4 and d.order == []
    assert d.why == ["adaptive", "adaptive", "no_offer", "no_offer"]
    # σ: a step that verifies anything pays it once, so a lone cheap draft no longer pays
    assert decide(StepView(1, 0.05, 0.0), [RowView([Offer("ngram", 0.3, 1)])]).ks == [("ngram", 1)]
    assert decide(StepView(1, 0.05, 0.3), [RowView([Offer("ngram", 0.3, 1)])]).why == ["adaptive"]


def test_each_row_keeps_a_prefix_and_the_order_lists_its_positions():
    rng = random.Random(2)
    for _ in range(500):
        n = rng.randint(1, 6)
        view = StepView(n + rng.randint(0, 4), rng.uniform(0.005, 0.2), rng.uniform(0, 0.1),
                        tpot_limit=rng.choice((HUGE, 1.05, 1.2)),
                        first_token_room=rng.choice((None, rng.uniform(0, 1))),
                        adaptive=rng.random() < 0.8, probe=rng.random() < 0.2)
        rows = [RowView([Offer(s, rng.uniform(0.05, 0.99), rng.randint(0, 8), rng.uniform(0, 0.1),
                               now=rng.uniform(0, 0.3), once=rng.uniform(0, 0.1))
                         for s in rng.sample(("ngram", "draft"), rng.randint(0, 2))],
                        rng.uniform(-0.5, 0.5)) for _ in range(n)]
        d = decide(view, rows)
        assert Counter(d.order) == Counter({i: k for i, (_, k) in enumerate(d.ks) if k})
        assert all((k == 0) == (src == "") for src, k in d.ks)
        assert all((w == "") == (k > 0) for w, (_, k) in zip(d.why, d.ks))
        assert all(w in ("", "no_offer", "adaptive", "latency", "first_token", "batch")
                   for w in d.why)


def test_each_row_drafts_from_the_source_with_the_larger_net_gain():
    """Net gain Σ_j (α^j - c·B) at the best k: 2 free n-gram drafts at 0.6 beat the
    model's 4 at 0.6 and 0.05 a position; 1 does not. Ties go to the first listed."""
    view = StepView(1, 0.0, 0.0, adaptive=False)
    ng2, ng1, model = Offer("ngram", 0.6, 2), Offer("ngram", 0.6, 1), Offer("draft", 0.6, 4, 0.05)
    # gains: n-gram 0.6 + 0.36 = 0.96 (k 2), 0.6 (k 1); the model 0.55 + 0.31 + 0.166 +
    # 0.0796 = 1.106 (k 4)
    assert decide(view, [RowView([ng2, model])]).ks == [("draft", 4)]
    assert decide(view, [RowView([Offer("ngram", 0.9, 3), model])]).ks == [("ngram", 3)]
    assert decide(view, [RowView([ng1, model])]).ks == [("draft", 4)]
    assert decide(view, [RowView([Offer("ngram", 0.1, 4), Offer("draft", 0.8, 4, 0.05)])]).ks \
        == [("draft", 4)]
    twin = [Offer("ngram", 0.5, 2), Offer("draft", 0.5, 2)]
    assert decide(view, [RowView(twin)]).ks == [("ngram", 2)]
    assert decide(view, [RowView(twin[::-1])]).ks == [("draft", 2)]
    # a catch-up paid once counts against its source: B times its share
    lag = Offer("draft", 0.6, 4, 0.05, once=0.4)
    assert decide(view, [RowView([ng2, lag])]).ks == [("ngram", 2)]


# -- decide: the bounds ----------------------------------------------------------------

def _random_step(rng: random.Random, probe: bool = False):
    n = rng.randint(1, 6)
    view = StepView(n + rng.randint(0, 4), rng.uniform(0.002, 0.08), rng.uniform(0, 0.05),
                    tpot_limit=rng.uniform(1.0, 1.5),
                    first_token_room=rng.choice((None, rng.uniform(0, 0.6))), probe=probe)
    rows = []
    for _ in range(n):
        offers = [Offer(s, rng.uniform(0.05, 0.99), rng.randint(0, 8), rng.uniform(0, 0.05),
                        now=rng.choice((0.0, rng.uniform(0, 0.3))),
                        once=rng.choice((0.0, rng.uniform(0, 0.1))))
                  for s in rng.sample(("ngram", "draft"), rng.randint(0, 2))]
        rows.append(RowView(offers, rng.uniform(-0.3, CREDIT_MAX)))
    return view, rows


def test_every_row_keeps_its_time_per_token_bound():
    """F <= tpot_limit·E[N_r] + credit_r for every row (E[N] = 1 for a row that drafts
    nothing), F and E[N] computed from the returned ks."""
    rng = random.Random(3)
    verified = bound = 0
    for _ in range(2000):
        view, rows = _random_step(rng)
        d = decide(view, rows)
        bound += "latency" in d.why
        if not any(k for _, k in d.ks):
            continue
        verified += 1
        _, f, per_row, _ = step_of(view, rows, d)
        for r, e_n in zip(rows, per_row):
            assert f <= view.tpot_limit * e_n + r.credit + 1e-9, (view, rows, d)
    assert verified > 300 and bound > 200  # the bound both bound and let rows through


def test_the_first_token_room_is_never_exceeded():
    """Σ over kept positions of verify + cost, each drafting row's ``now`` once, and σ:
    at most ``first_token_room``, probes included."""
    rng = random.Random(4)
    bound = 0
    for _ in range(2000):
        view, rows = _random_step(rng, probe=rng.random() < 0.3)
        d = decide(view, rows)
        if view.first_token_room is None or not any(k for _, k in d.ks):
            continue
        spent = step_of(view, rows, d)[3]
        assert spent <= view.first_token_room + 1e-9, (view, rows, d)
        bound += "first_token" in d.why
    assert bound > 50  # steps where the room bound


def test_the_time_per_token_bound_in_numbers():
    """4 rows, one drafting 3 positions at α 0.9 and 0.05 plain steps each. A row that
    gains nothing may be slowed 5 %: one position; budget saved lets more in, and a
    row that owes stops all."""
    def ks(credit_idle=0.0, credit_row=0.0, tpot=1.05, sigma=0.0, batch=4):
        rows = [RowView([Offer("ngram", 0.9, 3)], credit_row)] + \
               [RowView([], credit_idle) for _ in range(batch - 1)]
        d = decide(StepView(batch, 0.05, sigma, tpot_limit=tpot), rows)
        return d.ks[0][1], d.why[0]

    assert ks() == (1, "")                       # F = 1.05 <= 1.05 for the idle rows
    assert ks(tpot=HUGE) == (3, "")              # unbounded: all three pay
    assert ks(credit_idle=0.1) == (3, "")        # 1.15 <= 1.05 + 0.1
    assert ks(credit_idle=0.05) == (2, "")
    assert ks(credit_idle=-0.05) == (0, "latency")  # an idle row owes: nothing fits
    assert ks(sigma=0.02) == (0, "latency")      # σ leaves 0.03 < 0.05
    assert ks(batch=1) == (3, "")                # alone it is its own bound: 1.15 <= 3.6
    assert ks(batch=1, credit_row=-0.8, tpot=1.0) == (3, "")  # 1.05 <= 1.9 - 0.8, ...


@pytest.mark.xfail(strict=True, reason=(
    "known limitation: the greedy checks a row's own time-per-token bound position by "
    "position, so a row owing budget whose first position alone breaks its bound is "
    "dropped, though a longer prefix keeps it (its own drafts repay it)"))
def test_a_row_that_owes_is_not_dropped_where_a_longer_prefix_keeps_its_bound():
    """B = 1, tpot 1.0, credit -0.9: k = 1 gives F 1.05 > 1.9 - 0.9; k = 3 gives F 1.15
    <= 3.44 - 0.9 and the best goodput."""
    d = decide(StepView(1, 0.05, 0.0, tpot_limit=1.0), [RowView([Offer("ngram", 0.9, 3)], -0.9)])
    assert d.ks == [("ngram", 3)]


def test_positions_cut_for_the_bound_must_still_beat_a_plain_step():
    """16 rows, one drafting 3 positions at α 0.95, 0.0125 plain steps each, σ 0.03: the
    idle rows' bound (F <= 1.05) leaves one position, and 16.95 / 1.0425 tokens a plain
    step no longer beat 16 by MIN_GAIN: nothing verifies. Unbounded, all three pay."""
    rows = [RowView([Offer("ngram", 0.95, 3)])] + [RowView([]) for _ in range(15)]
    d = decide(StepView(16, 0.0125, 0.03), rows)
    assert d.ks == [("", 0)] * 16 and d.why[0] == "batch" and d.order == []
    assert decide(StepView(16, 0.0125, 0.03, tpot_limit=HUGE), rows).ks[0] == ("ngram", 3)


@pytest.mark.parametrize("a,b", [(0.02, 2e-5), (0.01, 5e-4)])
@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9, 0.999])
def test_k_is_non_increasing_in_batch(a, b, alpha):
    """B rows drafting alike, priced by a linear fit T(B) = a + b·B and a draft forward
    0.1 of a plain step: by the goodput rule (no latency bound) their k never grows with
    B, and a fit where a token costs ~ a row (b·B >> a) holds them at large B. (Prices
    assume every row drafts: a draft forward's share is 1 / B of it.)"""
    from vllm_specdec_plugin.control.cost import StepCost

    cost = StepCost()
    for _ in range(5):
        for n in (4, 8, 16, 40, 100, 257):
            cost.observe_step(a + b * n, n, 0, n)
    for passes in (1, 2, 3):
        for m in (1, 8, 64, 256):
            cost.observe_draft(passes * 0.1 * (a + b * m), passes, passes * m)
    ks = []
    for batch in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256):
        p = cost.prices(batch)
        assert p.draft_token == pytest.approx(0.1 / batch, rel=1e-6)
        rows = [RowView([Offer("draft", alpha, 8, p.draft_token)]) for _ in range(batch)]
        d = decide(StepView(batch, p.verify, p.sigma, tpot_limit=HUGE), rows)
        assert len({k for _, k in d.ks}) == 1  # rows alike get the same k
        ks.append(d.ks[0][1])
    assert all(x >= y for x, y in zip(ks, ks[1:])), ks
    if b == 5e-4:  # v(256) ~ 0.93: nothing pays at 256 rows
        assert ks[-1] == 0 and (ks[0] > 0 or alpha == 0.3)


def test_the_first_token_room_in_numbers():
    """Room 0.3 plain steps: σ 0.05, positions 0.05 each: 5 positions; a catch-up
    ``now`` fed in full counts once, on the row's first position."""
    rows = [RowView([Offer("ngram", 0.9, 4)]), RowView([Offer("ngram", 0.8, 4)])]
    d = decide(StepView(2, 0.05, 0.05, tpot_limit=HUGE, first_token_room=0.3), rows)
    assert sum(k for _, k in d.ks) == 5 and d.ks[0] == ("ngram", 4)
    fits = [RowView([Offer("draft", 0.9, 4, now=0.2)]), RowView([Offer("ngram", 0.8, 4)])]
    d = decide(StepView(2, 0.05, 0.05, tpot_limit=HUGE, first_token_room=0.3), fits)
    assert d.ks == [("draft", 1), ("", 0)] and d.why[1] == "first_token"  # 0.05 + 0.25
    lag = [RowView([Offer("draft", 0.9, 4, now=0.3)]), RowView([Offer("ngram", 0.8, 4)])]
    d = decide(StepView(2, 0.05, 0.05, tpot_limit=HUGE, first_token_room=0.3), lag)
    assert d.ks == [("", 0), ("ngram", 4)] and d.why[0] == "first_token"
    d = decide(StepView(2, 0.05, 0.05, tpot_limit=HUGE, first_token_room=0.3, adaptive=False),
               lag)
    assert d.ks == [("", 0), ("ngram", 4)] and d.why[0] == "first_token"
    d = decide(StepView(2, 0.05, 0.05, tpot_limit=HUGE, first_token_room=0.01), lag)
    assert d.ks == [("", 0), ("", 0)] and d.why == ["first_token", "first_token"]


def test_without_adaptive_every_draft_of_the_chosen_offer_is_taken():
    rng = random.Random(5)
    for _ in range(1000):
        view, rows = _random_step(rng)
        view = StepView(view.batch, view.verify, view.sigma, 1.0, None, adaptive=False)
        for r in rows:
            r.credit = -CREDIT_MAX  # no latency bound applies without adaptive
        d = decide(view, rows)
        for r, (src, k), w in zip(rows, d.ks, d.why):
            if any(o.k for o in r.offers):
                assert k == _offer(r, src).k and w == ""
            else:
                assert (src, k, w) == ("", 0, "no_offer")
    # a hopeless offer too: the user asked for k
    assert decide(StepView(64, 0.9, 0.5, adaptive=False),
                  [RowView([Offer("draft", 0.01, 8, 0.5)])]).ks == [("draft", 8)]


def test_a_probe_gives_priced_out_rows_one_draft():
    rows = [RowView([Offer("ngram", 0.9, 4)]), RowView([Offer("draft", 0.02, 4, 0.1)]),
            RowView([])]
    view = StepView(3, 0.05, 0.0, tpot_limit=HUGE)
    held = decide(view, rows)
    assert held.ks[1] == ("", 0) and held.why[1] == "adaptive" and held.ks[0][1] > 0
    probe = decide(StepView(3, 0.05, 0.0, tpot_limit=HUGE, probe=True), rows)
    assert probe.ks == [held.ks[0], ("draft", 1), ("", 0)]
    assert probe.why == ["", "", "no_offer"] and probe.order[-1] == 1
    # everyone priced out below MIN_GAIN: each probes once
    weak = [RowView([Offer("ngram", 0.51, 1)]) for _ in range(3)]
    assert decide(StepView(3, 0.5, 0.0), weak).why == ["adaptive"] * 3
    assert decide(StepView(3, 0.5, 0.0, probe=True), weak).ks == [("ngram", 1)] * 3
    # ... but not past the first token's room
    d = decide(StepView(3, 0.5, 0.0, first_token_room=1.2, probe=True), weak)
    assert sum(k for _, k in d.ks) == 2


# -- the hint, as the scheduler applies it ----------------------------------------------

def test_verify_cap_is_the_share_of_the_predicted_step_less_sigma():
    # a 10 ms + 1 ms a token + 0.5 ms a prompt token: 16 rows and 200 prompt tokens make
    # 126 ms; 5 % of it is 6.3 ms = 6 verify tokens
    hint = lambda s0=0.0, s1=0.0, share=0.05, q=0.0: Hint((0.010, 0.001, 0.0005, q, s0, s1),
                                                         share, ())  # noqa: E731
    assert verify_cap(hint(), 16, 200) == 6
    assert verify_cap(hint(s0=0.002), 16, 200) == 4     # σ comes out of the share
    assert verify_cap(hint(s0=0.001, s1=0.0001), 16, 200) == 3
    assert verify_cap(hint(s0=0.007), 16, 200) == 0     # never negative
    assert verify_cap(hint(share=0.0), 16, 200) == 0
    assert verify_cap(hint(q=0.001), 16, 200) == 7       # a row's cost lengthens the step
    # Beside a prompt a verify token costs what a prompt token does, where that is more
    # (a compute-bound step): 10 ms + 200 x 4 ms, 2.5 % is 20.25 ms = 5 tokens at 4 ms,
    # not 40 at the decode fit's 0.5 ms; the step a next prompt waits for is a decode step.
    cheap = Hint((0.010, 0.0005, 0.004, 0.0, 0.0, 0.0), 0.025, ())
    assert verify_cap(cheap, 0, 200) == 5
    assert verify_cap(cheap, 0, 200, beside_prompt=False) == 40
    assert verify_cap(Hint(None, 0.05, ()), 16, 200) is None  # no fit: no cap
    assert verify_cap(Hint((0.01, 0.0, 0.0005, 0.0, 0.0, 0.0), 0.05, ()), 16, 200) is None


def test_keep_is_a_capped_prefix_of_the_policys_order():
    rng = random.Random(6)
    for _ in range(300):
        n = rng.randint(1, 5)
        rows = [RowView([Offer("ngram", rng.uniform(0.1, 0.99), rng.randint(1, 6))])
                for _ in range(n)]
        d = decide(StepView(n, 0.01, 0.0, adaptive=False), rows)
        ids = [f"r{i}" for i in range(n)]
        hint = Hint(None, 0.025, tuple(ids[i] for i in d.order))
        total = sum(k for _, k in d.ks)
        prev = {}
        for cap in range(total + 3):
            kept = keep(hint, cap)
            assert kept == dict(Counter(hint.ranking[:cap]))
            assert sum(kept.values()) == min(cap, total)
            for i, rid in enumerate(ids):  # per row: no more than it drafted, growing with cap
                assert prev.get(rid, 0) <= kept.get(rid, 0) <= d.ks[i][1]
            prev = kept
        # the order is worth per cost, best first (costs are equal here)
        seen, ratios = Counter(), []
        for i in d.order:
            seen[i] += 1
            ratios.append(rows[i].offers[0].alpha ** seen[i])
        assert ratios == sorted(ratios, reverse=True)


def _req(rid, prompt, computed, outputs=0, spec=()):
    return SimpleNamespace(request_id=rid, num_prompt_tokens=prompt,
                           num_computed_tokens=computed, num_tokens=prompt + outputs,
                           num_output_tokens=outputs, spec_token_ids=list(spec))


def _scheduler(running, waiting, budget=64, slots=8, finished=()):
    return SimpleNamespace(running=running, waiting=waiting, kv_holding_waiting=[],
                           max_num_scheduled_tokens=budget, max_num_active_reqs=slots,
                           finished_req_ids=set(finished))


def _side(hint, prompts=None):
    side = sched.SchedulerSide.__new__(sched.SchedulerSide)
    side.hint, side.aborted, side.prompts = hint, set(), dict(prompts or {})
    side._metrics = SimpleNamespace(verify_tokens=lambda kept, cut: None)
    return side


def _two_rows():
    return (_req("a", 10, 13, outputs=4, spec=[1, 2, 3, 4]),
            _req("b", 10, 13, outputs=4, spec=[5, 6, 7, 8]))


# the policy's order for a at α 0.9 and b at 0.7 (4 drafts each, as decide takes them):
# worth .9, .81, .729, then b's .7, a's .656, then b's .49, .343, .24
ORDER = ("a", "a", "a", "b", "a", "b", "b", "b")


def test_the_policy_order_of_two_rows():
    d = decide(StepView(2, 0.01, 0.0, adaptive=False),
               [RowView([Offer("ngram", 0.9, 4)]), RowView([Offer("ngram", 0.7, 4)])])
    assert tuple("ab"[i] for i in d.order) == ORDER


def test_the_scheduler_cuts_drafts_for_a_waiting_prompt_to_the_token_budget():
    a, b = _two_rows()
    sched._bound_drafts(_scheduler([a, b], [_req("n", 50, 0)], budget=60),
                        _side(Hint(None, 0.025, ORDER)))  # 60 - 2 rows - 50 = 8: all kept
    assert a.spec_token_ids == [1, 2, 3, 4] and b.spec_token_ids == [5, 6, 7, 8]
    before = dict(sched.counts)
    sched._bound_drafts(_scheduler([a, b], [_req("n", 50, 0)], budget=57),
                        _side(Hint(None, 0.025, ORDER)))  # room 5: the order's first 5
    assert a.spec_token_ids == [1, 2, 3, 4] and b.spec_token_ids == [5]
    assert sched.counts["cut"] - before["cut"] == 3
    assert sched.counts["kept"] - before["kept"] == 5


def test_the_first_tokens_share_sets_what_a_prefill_step_verifies():
    # without drafts: 10 ms + 2 rows + a 50-token prompt at 1 ms a token = 62 ms
    kept = {}
    for share in (0.0, 0.05, 1.0):
        a, b = _two_rows()
        sched._bound_drafts(_scheduler([a, b], [_req("n", 50, 0)], budget=200),
                            _side(Hint((0.01, 0.001, 0.001, 0.0, 0.0, 0.0), share, ORDER)))
        kept[share] = (len(a.spec_token_ids), len(b.spec_token_ids))
    # 0: nothing beside the prompt; 0.05: 3.1 ms = 3 tokens (the order's first 3); 1.0: all 8
    assert kept == {0.0: (0, 0), 0.05: (3, 0), 1.0: (4, 4)}


def test_the_scheduler_keeps_drafts_when_no_prompt_comes():
    a, _ = _two_rows()
    hint = Hint((0.01, 0.001, 0.001, 0.0, 0.0, 0.0), 0.0, ("a",) * 4)
    sched._bound_drafts(_scheduler([a], [], budget=3), _side(hint))
    assert a.spec_token_ids == [1, 2, 3, 4]
    sched._bound_drafts(_scheduler([a], [_req("n", 50, 0)], budget=3, slots=1), _side(hint))
    assert a.spec_token_ids == [1, 2, 3, 4]  # the waiting one cannot be admitted anyway
    sched._bound_drafts(_scheduler([a], [_req("n", 50, 0)]), _side(None))
    assert a.spec_token_ids == [1, 2, 3, 4]  # no decision yet: nothing to apply


def test_a_running_chunked_prefill_counts_as_prefilling():
    a, _ = _two_rows()
    chunk = _req("c", 100, 40)
    sched._bound_drafts(_scheduler([a, chunk], [], budget=63),
                        _side(Hint(None, 0.025, ("a",) * 4)))  # 63 - 1 - 60 = 2
    assert a.spec_token_ids == [1, 2]


def test_the_step_after_a_request_finished_is_cut_for_the_next_arrival():
    hint = Hint((0.01, 0.001, 0.001, 0.0, 0.0, 0.0), 0.05, ORDER)  # 62 ms: 3 tokens

    def cut(finished, prompts, h=hint):
        a, b = _two_rows()
        side = _side(h, prompts)
        sched._bound_drafts(_scheduler([a, b], [], budget=200, finished=finished), side)
        return len(a.spec_token_ids) + len(b.spec_token_ids), side.prompts

    before = sched.counts["arrival"]
    assert cut({"x"}, {"x": 50, "y": 10}) == (3, {"y": 10})  # priced with its prompt, forgotten
    assert sched.counts["arrival"] == before + 1
    assert cut(set(), {"x": 50}) == (8, {"x": 50})            # nobody finished
    assert cut({"x"}, {}) == (8, {})                          # never seen: no prompt known
    assert cut({"x"}, {"x": 50}, Hint(None, 0.05, ORDER)) == (8, {})  # no fit: no cap
    # two finished: priced with their mean prompt, (10 + 90) / 2 = 50 tokens
    assert cut({"x", "y"}, {"x": 10, "y": 90}) == (3, {})


def test_a_prompt_that_fills_the_token_budget_leaves_no_verify_token():
    a, b = _two_rows()
    sched._bound_drafts(_scheduler([a, b], [_req("n", 4000, 0)], budget=2048),
                        _side(Hint((0.01, 0.001, 0.0005, 0.0, 0.0, 0.0), 1.0, ORDER)))
    assert a.spec_token_ids == [] and b.spec_token_ids == []


def test_first_tokens_marks_prompts_completed_this_step():
    reqs = {"done": _req("done", 10, 10),          # scheduled 10: whole prompt now
            "chunk": _req("chunk", 100, 50),       # scheduled 50 of 100
            "last": _req("last", 100, 100),        # scheduled the last 40
            "dec": _req("dec", 10, 12, outputs=2)}
    out = SimpleNamespace(num_scheduled_tokens={"done": 10, "chunk": 50, "last": 40, "dec": 1})
    assert sched.first_tokens(SimpleNamespace(requests=reqs), out) == {"done", "last"}


def test_next_prefill_counts_unfinished_and_admissible_prompts_within_the_budget():
    dec = _req("a", 10, 13, outputs=4)
    assert sched.next_prefill(_scheduler([dec], [])) == 0
    assert sched.next_prefill(_scheduler([dec, _req("c", 100, 40)], [])) == 60
    assert sched.next_prefill(_scheduler([dec], [_req("n", 50, 0)], slots=2)) == 50
    assert sched.next_prefill(_scheduler([dec], [_req("n", 50, 0)], slots=1)) == 0
    assert sched.next_prefill(_scheduler([dec], [_req("n", 500, 0)], budget=64)) == 64
    assert sched.read_next_prefill(SimpleNamespace()) == 0  # not attached: none known


def test_drafts_cut_before_verification_are_not_booked():
    req = RequestState(tokens=list(range(12)), committed=8, drafted=[8, 9, 10, 11])
    assert keep_scheduled(req, 4, None) == 0 and req.drafted == [8, 9, 10, 11]
    assert keep_scheduled(req, 2, None) == 2 and req.drafted == [8, 9]
    assert len(req.tokens) == 12          # verified drafts' KV stays until roll_back
    assert keep_scheduled(req, 0, None) == 2 and req.drafted == []
    assert req.tokens == list(range(8))   # none verified: the drafts' KV goes now


# -- the time-per-token ledger ---------------------------------------------------------

def test_settle_books_each_decode_step_against_the_bound():
    req = RequestState()
    req.settle(1, 1.0, 1.05)  # a plain step saves the bound's 5 %
    assert req.credit == pytest.approx(0.05)
    req.settle(2, 1.3, 1.05)  # an accepted draft earns more than the slower step costs
    assert req.credit == pytest.approx(0.05 + 2.1 - 1.3)
    slowed = RequestState()
    slowed.settle(1, 1.3, 1.05)  # slowed beside others' drafts: owes
    assert slowed.credit == pytest.approx(-0.25)
    for _ in range(100):
        req.settle(1, 1.0, 1.05)
    assert req.credit == CREDIT_MAX
    slowed.settle(1, 9.0, 1.05)
    assert slowed.credit == -CREDIT_MAX


# -- probes ----------------------------------------------------------------------------

HELD = Decision([("", 0)], ["adaptive"], [])
DRAFTS = Decision([("ngram", 2)], [""], [0, 0])


def _probe_steps(schedule: ProbeSchedule, steps: int, by_rule=lambda j: False) -> list[int]:
    """Run ``steps`` steps of a held row; returns the steps (1-based) that probed. A
    step after a probe drafts by the rule where ``by_rule(j)``."""
    probes = []
    for j in range(1, steps + 1):
        probe = schedule.probe()
        if probe:
            probes.append(j)
            schedule.decided(Decision([("ngram", 1)], [""], [0]), True)
        else:
            schedule.decided(DRAFTS if by_rule(j) else HELD, False)
    return probes


def test_probes_come_every_probe_every_held_steps_then_back_off():
    schedule = ProbeSchedule()
    assert not schedule.probe()  # nothing held yet
    schedule.decided(HELD, False)
    probes = _probe_steps(schedule, 8 + 17 + 33 + 65 + 129 + 129 + 10)
    gaps = [b - a for a, b in zip([0] + probes, probes)]
    assert PROBE_EVERY == 8 and PROBE_MAX == 128  # the cadence below
    # intervals 8, 16, 32, 64, 128, 128 held steps; a probe step holds no row (each got
    # a draft), so the step after it is the first counted again
    assert gaps == [8, 17, 33, 65, 129, 129]
    # "batch" holds rows too
    b = ProbeSchedule()
    b.decided(Decision([("", 0)], ["batch"], []), False)
    assert _probe_steps(b, 8)[0] == 8


def test_a_probe_followed_by_drafting_by_the_rule_resets_the_interval():
    schedule = ProbeSchedule()
    schedule.decided(HELD, False)
    # the step after each probe drafts by the rule (the probe lifted the row), then the
    # row is held again: the interval stays at PROBE_EVERY
    probes = []
    last = None
    for j in range(1, 60):
        probe = schedule.probe()
        if probe:
            probes.append(j)
            last = j
            schedule.decided(Decision([("ngram", 1)], [""], [0]), True)
        elif last is not None and j == last + 1:
            schedule.decided(DRAFTS, False)
        else:
            schedule.decided(HELD, False)
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # not doubling: PROBE_EVERY held steps after the probe step and the step by the rule
    assert probes[0] == PROBE_EVERY and gaps == [PROBE_EVERY + 2] * 5, probes
    # rows that draft by the rule do not tick: no probe while nothing is held
    quiet = ProbeSchedule()
    for _ in range(50):
        assert not quiet.probe()
        quiet.decided(DRAFTS, False)


# -- the host-time term -----------------------------------------------------------------

def run(cost: PlanningCost, batch: int, host: float, saved: float, steps: int,
        room_s: float | None = None) -> list[bool]:
    """``steps`` steps at ``batch``: plan when it says so; each plan costs ``host`` and
    the step after it saves ``saved`` (an unplanned step books nothing)."""
    planned = []
    for _ in range(steps):
        p = cost.plan(batch, room_s)
        planned.append(p)
        if p:
            cost.planned(batch, host)
        cost.book(saved if p else 0.0)
    return planned


def _steps_to_min() -> int:
    """Planned steps until the decayed count of pairs reaches HOST_MIN_STEPS."""
    den, n = 0.0, 0
    while den < HOST_MIN_STEPS:
        den, n = HOST_DECAY * den + 1.0, n + 1
    return n


def test_plans_while_it_pays_and_before_evidence():
    assert all(run(PlanningCost(), 16, host=1e-3, saved=3e-3, steps=200))
    n = _steps_to_min()
    assert n >= HOST_MIN_STEPS
    cost = PlanningCost()
    assert all(run(cost, 64, host=3e-3, saved=1e-3, steps=n - 1))  # too few pairs yet
    assert not cost.skipping(64)


def test_skips_where_planning_costs_more_and_trials_back_off():
    cost = PlanningCost()
    planned = run(cost, 64, host=3e-3, saved=1e-3, steps=2000)
    n = _steps_to_min()  # the pair that brings the decayed count to HOST_MIN_STEPS
    assert planned[:n] == [True] * n and planned[n] is False and cost.skipping(64)
    # each trial plans a fresh window of n steps; a losing one doubles the wait
    starts = [i for i in range(n, len(planned)) if planned[i] and not planned[i - 1]]
    ends = [i for i in range(n + 1, len(planned)) if not planned[i] and planned[i - 1]]
    assert len(starts) > 6 and all(e - s == n for s, e in zip(starts, ends))
    waits = [s - e for e, s in zip([n] + ends, starts)]
    assert waits[:6] == [7, 15, 31, 63, 127, 127]  # PROBE_EVERY, doubling to PROBE_MAX
    assert sum(planned) < len(planned) / 8


def test_a_trial_that_pays_resumes_planning_and_buckets_are_apart():
    cost = PlanningCost()
    run(cost, 40, host=3e-3, saved=1e-3, steps=40)
    # buckets are powers of two: 32-63 skip, 64 and 16 have no evidence of their own
    assert cost.skipping(40) and cost.skipping(63) and not cost.skipping(64)
    assert all(run(cost, 16, host=1e-3, saved=3e-3, steps=20))
    # the same load now pays a little: the old losses do not count against the trial
    planned = run(cost, 40, host=1e-3, saved=1.5e-3, steps=PROBE_MAX + 5)
    first = planned.index(True)
    assert cost.probing is False and not cost.skipping(40)
    assert all(planned[first:]) and first < PROBE_MAX


def test_a_won_trial_resets_the_backoff():
    cost = PlanningCost()
    n = _steps_to_min()
    run(cost, 64, host=3e-3, saved=1e-3, steps=n + 7 + n + 15)  # skipped, lost a trial
    assert cost.skipping(64)
    run(cost, 64, host=1e-3, saved=3e-3, steps=40)  # wins its next trial
    assert not cost.skipping(64)
    planned = run(cost, 64, host=3e-3, saved=1e-3, steps=300)
    first_skip = planned.index(False)
    assert planned[first_skip:first_skip + 8] == [False] * 7 + [True]  # PROBE_EVERY again


def test_probing_marks_the_trial_start_only_and_unmeasurable_steps_drop_the_pair():
    cost = PlanningCost()
    assert cost.plan(64) and not cost.probing  # no evidence: a plain plan
    cost.planned(64, 5e-3)
    cost.book(None)  # the step after carried a prefill: the pair is dropped
    cost.book(-1.0)  # nothing pending: nothing booked
    run(cost, 64, host=5e-3, saved=0.0, steps=_steps_to_min())
    assert cost.skipping(64)
    seen = [(cost.plan(64), cost.probing) for _ in range(PROBE_EVERY)]
    assert seen == [(False, False)] * (PROBE_EVERY - 1) + [(True, True)]
    assert not cost.skipping(64) and cost.plan(64) and not cost.probing  # the window


def test_never_plans_where_planning_alone_overruns_the_first_tokens_room():
    cost = PlanningCost()
    assert cost.plan(8, room_s=0.0)  # no host time measured yet
    for host in (1e-3, 3e-3):
        cost.planned(8, host)
        cost.book(None)
    mean = (HOST_DECAY * 1e-3 + 3e-3) / (HOST_DECAY + 1.0)
    assert not cost.plan(8, room_s=0.99 * mean) and not cost.probing
    assert cost.plan(8, room_s=1.01 * mean) and cost.plan(8, room_s=None)
    # in a skipped bucket too, and it does not count towards the probe
    run(cost, 64, host=3e-3, saved=0.0, steps=_steps_to_min())
    assert cost.skipping(64)
    assert not any(cost.plan(64, room_s=0.0) for _ in range(3 * PROBE_EVERY))
    assert [cost.plan(64) for _ in range(PROBE_EVERY)][-1] is True


def test_saved_seconds():
    # a plain step saves exactly nothing; 8 rows emitting 12 tokens at 10 ms a plain step,
    # in a step predicted at 11 ms plus 1 ms of σ (F = 1.2 plain steps)
    assert saved_seconds(8, 8, 0.010, 1.0) == 0.0
    assert saved_seconds(12, 8, 0.010, (0.011 + 0.001) / 0.010) == pytest.approx(0.015 - 0.012)


def test_a_sampled_row_pays_for_the_positions_its_verification_reaches():
    """reach·α^j on position j (the pipeline runs on the next position as often as j is
    accepted): with the price of a top-p sort a sampled row verifies fewer drafts than
    the same greedy row, and none where even its first draft does not pay; reach 0 is
    the greedy decision."""
    view = StepView(batch=1, verify=0.05, sigma=0.1, tpot_limit=HUGE)
    offer = lambda: [Offer("ngram", 0.8, 8)]  # noqa: E731
    greedy = decide(view, [RowView(offer())])
    sampled = decide(view, [RowView(offer(), reach=0.3)])
    assert greedy.ks[0][1] == 8
    assert 0 < sampled.ks[0][1] < 8
    assert decide(view, [RowView(offer(), reach=0.0)]).ks == greedy.ks
    poor = decide(StepView(batch=1, verify=0.05, sigma=0.1, tpot_limit=HUGE),
                  [RowView([Offer("ngram", 0.3, 8)], reach=3.0)])
    assert poor.ks == [("", 0)]


def test_beside_a_prompt_a_verify_token_is_priced_as_a_prompt_token():
    """With a prompt next, the first token's room is spent at max(verify, prefill) a
    position: a room of 0.1 plain steps holds 9 drafts at 0.01 but 1 at 0.08; without a
    prompt the prefill price changes nothing."""
    rows = lambda: [RowView([Offer("ngram", 0.99, 9)])]  # noqa: E731
    at = lambda prefill, room: decide(StepView(1, 0.01, 0.0, HUGE, room, adaptive=False,  # noqa: E731
                                               prefill=prefill), rows()).ks[0][1]
    assert at(0.0, 0.1) == 9
    assert at(0.08, 0.1) == 1
    assert at(0.08, None) == 9
