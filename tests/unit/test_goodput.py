"""The goodput check (``goodput``): verdicts from measured whole cycles (pure Python)."""

from vllm_specdec_plugin.goodput import GoodputCheck, bucket


def _cycles(g: GoodputCheck, n: int, *, rows: int, seconds: float, emitted: int,
            verified: bool, plan_s: float = 0.0, prefill_s: float = 0.0) -> None:
    for _ in range(n):
        g.planned(plan_s)
        g.observe(seconds, rows, emitted, prefill_s, verified)


def test_buckets_are_powers_of_two():
    assert [bucket(b) for b in (1, 2, 3, 4, 7, 8, 63, 64)] == [0, 1, 1, 2, 2, 3, 5, 6]


def test_drafting_is_allowed_until_a_bucket_has_evidence():
    g = GoodputCheck()
    assert g.allows(64) and g.gain(64) is None
    _cycles(g, 5, rows=64, seconds=0.1, emitted=64, verified=True)
    assert g.gain(64) is None  # no plain baseline yet: nothing is booked
    _cycles(g, 20, rows=64, seconds=0.1, emitted=64, verified=False)
    _cycles(g, 4, rows=64, seconds=0.1, emitted=60, verified=True)
    assert g.gain(64) < 1 and g.allows(64)  # fewer cycles than GOODPUT_MIN_CYCLES


def test_verifying_cycles_that_pay_keep_drafting_on():
    g = GoodputCheck()
    _cycles(g, 20, rows=16, seconds=0.05, emitted=16, verified=False)
    _cycles(g, 30, rows=16, seconds=0.055, emitted=24, verified=True)
    assert abs(g.gain(16) - (24 / 16) / 1.1) < 1e-6
    assert all(g.allows(16) for _ in range(50))


def test_host_time_counts_against_drafting_and_trials_re_measure():
    """Verifying steps emit 12 % more tokens per target second, but the proposer's
    planning for them costs 15 %: drafting stops, except in trial stretches whose
    interval doubles while they do not pay and resets when one does."""
    g = GoodputCheck(every=8, most=32, trial_steps=4, min_cycles=8)
    _cycles(g, 20, rows=64, seconds=0.1, emitted=64, verified=False)
    _cycles(g, 30, rows=64, seconds=0.1, emitted=72, plan_s=0.015, verified=True)
    assert 0.97 < g.gain(64) < 0.98

    def run(steps: int, verified_pays: bool) -> list[bool]:
        out = []
        for _ in range(steps):
            ok = g.allows(64)
            out.append(ok)
            if ok:  # a trial step drafts; its cycle is observed at the next call
                _cycles(g, 1, rows=64, seconds=0.1, emitted=90 if verified_pays else 72,
                        plan_s=0.015, verified=True)
            else:
                _cycles(g, 1, rows=64, seconds=0.1, emitted=64, verified=False)
        return out

    held = run(80, verified_pays=False)
    trials = [i for i, ok in enumerate(held) if ok]
    # trials of 4 steps after 8, then 16, then 32 (the most) held steps
    assert trials == [*range(7, 11), *range(26, 30), *range(61, 65)]
    # traffic changes: drafting pays again; the next trial finds it and drafting resumes
    resumed = run(60, verified_pays=True)
    first = resumed.index(True)
    assert all(resumed[first:])


def test_prefill_cost_is_taken_out_of_the_cycle():
    """A verifying cycle that also prefilled is compared without its prefill's
    fitted seconds."""
    g = GoodputCheck()
    _cycles(g, 20, rows=8, seconds=0.04, emitted=8, verified=False)
    _cycles(g, 10, rows=8, seconds=0.04 + 0.2, prefill_s=0.2, emitted=12, verified=True)
    assert abs(g.gain(8) - 1.5) < 1e-6


def test_snapshot_names_each_bucket_by_its_smallest_batch():
    g = GoodputCheck()
    _cycles(g, 10, rows=5, seconds=0.02, emitted=5, verified=False)
    _cycles(g, 10, rows=5, seconds=0.02, emitted=10, verified=True)
    assert g.snapshot() == {"gain": {4: 2.0}, "interval": 8}
