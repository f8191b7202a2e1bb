"""Whether planning drafts pays for its own host time, per batch size (pure Python).

Planning a step (every row's n-gram lookup and pricing, the controllers, the row
bound, the draft round) runs on the host between two target steps, whether or not it
finds drafts worth verifying. Under load a verifying step saves little per row and
the row bound lets few of them through, so planning can cost more than it saves:
smol pair, ShareGPT chat, c = 64 (bf16, 2026-11-30, ``experiments/host_time``):
``propose`` took 2.4 ms a step at 64 rows against 1.1 ms for the floor (which plans
but never drafts), and verification saved ~1.7 ms of target time a step.

So the proposer times each planned step (``planned``) and books what the target step
that verified the plan saved (``book``): the seconds a plain step at that batch would
take for the tokens it emitted, less the step's predicted time and σ (``StepRecorder``;
exactly 0 for a step that verified nothing). Both add up, decayed, per batch bucket
(powers of two: a load change meets its own evidence). While a bucket's saving falls
short of its host time the proposer skips planning there: rows decode plainly, which
is always exact, and only every ``interval``-th step plans (a probe), the interval
doubling from ``PROBE_EVERY`` to ``PROBE_MAX`` while planning still does not pay.
A probe plans n-gram drafts only (``probing``): after skipped steps every row's draft
KV lags by the tokens since, and a draft-model round would first catch all of them
up (served at c = 64: 170-250 ms probes, more than the skipped steps saved).
The gate serves the n-gram methods ("ngram", "hybrid"): their per-row lookups are
the host time it prices; a draft-model round is priced in c' already.
"""

from __future__ import annotations

from vllm_specdec_plugin.tuning import HOST_GATE_DECAY, HOST_GATE_MIN_PAIRS, PROBE_EVERY, PROBE_MAX


class _Bucket:
    __slots__ = ("saved", "host", "weight", "skipping", "interval", "since")

    def __init__(self, probe_every: int) -> None:
        self.saved = 0.0  # decayed Σ seconds the verifications of plans saved
        self.host = 0.0  # decayed Σ host seconds of those plans
        self.weight = 0.0  # decayed count of (plan, verification) pairs
        self.skipping = False
        self.interval = probe_every  # steps between probe plans while skipping
        self.since = 0  # steps skipped since the last probe


class HostGate:
    """Plan a step or skip it, from measured host time against measured saving."""

    def __init__(self, decay: float = HOST_GATE_DECAY, min_pairs: float = HOST_GATE_MIN_PAIRS,
                 probe_every: int = PROBE_EVERY, probe_max: int = PROBE_MAX) -> None:
        if not 0.0 < decay <= 1.0 or min_pairs < 0 or not 1 <= probe_every <= probe_max:
            raise ValueError(f"need 0 < decay <= 1, min_pairs >= 0 and 1 <= probe_every <= "
                             f"probe_max, got {decay!r}, {min_pairs!r}, {probe_every!r}, "
                             f"{probe_max!r}")
        self.decay, self.min_pairs = decay, min_pairs
        self.probe_every, self.probe_max = probe_every, probe_max
        self._buckets: dict[int, _Bucket] = {}
        self._pending: tuple[int, float] | None = None  # (bucket, host seconds) of the last plan
        self.probing = False  # the last ``plan`` was a probe of a skipping bucket

    def plan(self, batch: int) -> bool:
        """Whether to plan the step at ``batch`` decoding rows (call once per step)."""
        self.probing = False
        b = self._buckets.get(batch.bit_length())
        if b is None or not b.skipping:
            return True
        b.since += 1
        if b.since < b.interval:
            return False
        b.since = 0
        self.probing = True
        return True

    def planned(self, batch: int, host_s: float) -> None:
        """A step at ``batch`` rows was planned in ``host_s`` seconds; ``book`` pairs it
        with what the next target step saves."""
        self._pending = (batch.bit_length(), max(host_s, 0.0))

    def book(self, saved_s: float | None) -> None:
        """What the target step that just ended saved (seconds; may be < 0), paired with
        the plan before it, if any. None: not measurable (a step that carried a
        prefill), and the plan's pair is dropped."""
        pending, self._pending = self._pending, None
        if pending is None or saved_s is None:
            return
        key, host = pending
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket(self.probe_every)
        d = self.decay
        b.saved = d * b.saved + saved_s
        b.host = d * b.host + host
        b.weight = d * b.weight + 1.0
        if b.weight < self.min_pairs:
            return
        if b.saved >= b.host:
            b.skipping, b.interval, b.since = False, self.probe_every, 0
        elif b.skipping:  # a probe that did not pay
            b.interval = min(2 * b.interval, self.probe_max)
        else:
            b.skipping, b.interval, b.since = True, self.probe_every, 0

    def skipping(self, batch: int) -> bool:
        """Planning is being skipped at ``batch`` rows (tests read it)."""
        b = self._buckets.get(batch.bit_length())
        return b is not None and b.skipping
