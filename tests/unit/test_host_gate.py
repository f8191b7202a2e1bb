"""host_gate: planning is skipped per batch bucket while verification saves less target
time than planning costs the host, with probes that back off and recover."""

import pytest

from vllm_specdec_plugin.host_gate import HostGate
from vllm_specdec_plugin.step_record import saved_seconds


def run(gate: HostGate, batch: int, host: float, saved: float, steps: int) -> list[bool]:
    """``steps`` steps at ``batch``: plan when the gate says so; each plan costs ``host``
    and the step after it saves ``saved`` (an unplanned step saves 0, unpaired)."""
    planned = []
    for _ in range(steps):
        p = gate.plan(batch)
        planned.append(p)
        if p:
            gate.planned(batch, host)
        gate.book(saved if p else 0.0)
    return planned


def test_plans_while_it_pays_and_before_evidence():
    gate = HostGate(decay=0.9, min_pairs=4, probe_every=2, probe_max=8)
    assert all(run(gate, 16, host=1e-3, saved=3e-3, steps=50))
    gate = HostGate(decay=0.9, min_pairs=4, probe_every=2, probe_max=8)
    assert all(run(gate, 64, host=3e-3, saved=1e-3, steps=4))  # not enough pairs yet


def test_skips_where_planning_costs_more_and_probes_back_off():
    gate = HostGate(decay=0.9, min_pairs=4, probe_every=2, probe_max=8)
    planned = run(gate, 64, host=3e-3, saved=1e-3, steps=60)
    # the fifth pair brings the decayed count to 4.1: it skips from then on
    assert planned[:5] == [True] * 5 and gate.skipping(64)
    probes = [i for i, p in enumerate(planned) if p and i >= 4]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:4] == [2, 4, 8, 8]  # the interval doubles up to probe_max
    assert sum(planned) < 15


def test_buckets_are_separate_and_recover():
    gate = HostGate(decay=0.5, min_pairs=1.5, probe_every=2, probe_max=4)
    run(gate, 40, host=3e-3, saved=1e-3, steps=20)
    # buckets are powers of two: 32-63 skip, 64 and 16 have no evidence of their own
    assert gate.skipping(40) and gate.skipping(63) and not gate.skipping(64)
    assert all(run(gate, 16, host=1e-3, saved=3e-3, steps=10))  # another load: its own evidence
    run(gate, 40, host=1e-3, saved=5e-3, steps=20)  # the same load now pays: probes see it
    assert not gate.skipping(40)


def test_unmeasurable_steps_drop_the_pair():
    gate = HostGate(decay=0.9, min_pairs=1, probe_every=2, probe_max=8)
    gate.planned(64, 5e-3)
    gate.book(None)  # the step after carried a prefill
    assert not gate.skipping(64)
    gate.book(-1.0)  # nothing pending: nothing booked
    assert not gate.skipping(64)
    gate.planned(64, 5e-3)
    gate.book(0.0)
    assert gate.skipping(64)


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="decay"):
        HostGate(decay=0.0)
    with pytest.raises(ValueError, match="probe_every"):
        HostGate(probe_every=16, probe_max=8)


def test_saved_seconds():
    # a plain step saves exactly nothing; 8 rows emitting 12 tokens at 10 ms a plain step,
    # in a step predicted at 11 ms plus 1 ms of σ (F = 1.2 plain steps)
    assert saved_seconds(8, 8, 0.010, 1.0) == 0.0
    assert saved_seconds(12, 8, 0.010, (0.011 + 0.001) / 0.010) == pytest.approx(0.015 - 0.012)


def test_probing_marks_the_probe_steps_only():
    gate = HostGate(decay=0.9, min_pairs=1, probe_every=2, probe_max=8)
    assert gate.plan(64) and not gate.probing  # no evidence: a plain plan
    gate.planned(64, 5e-3)
    gate.book(0.0)
    seen = []
    for _ in range(4):
        seen.append((gate.plan(64), gate.probing))
        gate.book(0.0)  # nothing planned: nothing pending
    assert seen == [(False, False), (True, True), (False, False), (True, True)]
