"""The step policy: the one place that decides what a step verifies (pure Python).

``decide`` takes every row's offers (per source: acceptance α, drafts, cost) and the
step's prices and bounds, and returns each row's source and k (0 included), in plain
steps (a step without drafts at this batch = 1; it emits B tokens).

- **Goodput** E / F, tokens per plain step: position j of a row is worth α^j and costs c
  = v (a verify token) + its source's cost (the draft model: its forward's share and its
  catch-up spread over the request's rounds) + on a sampled row ``reach``·α^j (the
  sampling pipeline runs on the position after draft j only if drafts 1..j were
  accepted); a verifying step also pays σ. Positions go
  by worth / cost, best first, while they raise E / F (so each row keeps a prefix); the
  step verifies only if that beats B by ``MIN_GAIN``. A row's source: the offer with the
  larger net gain Σ_j (α^j - c·B) at its best k.
- **Bounds**: no row's time per token over ``tpot_limit`` of a plain step's less the
  budget it saved, F <= tpot_limit·E[N_r] + credit_r (a row that gains nothing bounds the
  whole step; the budget carries slack between steps: ``RequestState.settle``); when a
  prompt comes next, drafting, verification and σ within ``first_token_room`` (a verify
  token beside a prompt priced at least as a prompt token: the step is compute-bound).
- **Probes** give every row with an offer one draft, so a stale α is measured again
  (``ProbeSchedule``); **host time** (``PlanningCost``): a batch size where planning
  took more than it saved is planned only in trial windows, nor past the first token's room.
  Without ``adaptive`` a row verifies all its offer's drafts, within the first token's room.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

from vllm_specdec_plugin.control.estimators import Backoff, DecayedRate
from vllm_specdec_plugin.tuning import (HOST_DECAY, HOST_MIN_STEPS, MIN_GAIN, PROBE_EVERY,
                                        PROBE_MAX)

NONE = ("", 0)


@dataclass(slots=True)
class Offer:
    """What one draft source offers one row this step."""

    source: str         # "ngram" or "draft"
    alpha: float        # per-token acceptance the drafts are priced at
    k: int              # most drafts (n-gram: those found; draft model: its room)
    cost: float = 0.0   # plain steps a position adds beyond its verify token
    now: float = 0.0    # plain steps the round adds now (its catch-up): first token's room
    once: float = 0.0   # the same amortised over the request's rounds: on its first position


@dataclass(slots=True)
class RowView:
    offers: list[Offer]
    credit: float = 0.0  # time-per-token budget saved (+) or owed (-), plain steps
    reach: float = 0.0   # a sampled row: plain steps one more position costs verification


@dataclass(frozen=True, slots=True)
class StepView:
    batch: int                 # B: decoding rows, all pay the step's time
    verify: float              # v: one verify token, plain steps
    sigma: float               # σ: a step that verifies anything, plain steps
    tpot_limit: float = 1.05   # a row's time per token at most this x a plain step's
    first_token_room: float | None = None  # plain steps before a prompt's step (None: no prompt next)
    adaptive: bool = True
    probe: bool = False
    prefill: float = 0.0       # one prompt token, plain steps: a verify token's price beside one


@dataclass(slots=True)
class Decision:
    """Per row (source, k) (``NONE``: none) and why it verifies nothing ("" if it does;
    "no_offer", "adaptive", "latency", "first_token", "batch": the rest did not beat a
    plain step); ``order``: the kept positions' rows as taken (the scheduler's ``Hint``)."""

    ks: list[tuple[str, int]]
    why: list[str]
    order: list[int]


def decide(view: StepView, rows: list[RowView]) -> Decision:
    """The step's decision (module docstring)."""
    # Beside a prompt the step is compute-bound: a verify token costs a prompt token's time
    # where that is more (as ``verify_cap`` prices the scheduler's cut).
    room = view.first_token_room
    B, v = max(view.batch, 1), view.verify if room is None else max(view.verify, view.prefill)
    chosen: list[Offer | None] = [_choose(r.offers, v, B, r.reach) for r in rows]
    why = ["no_offer" if o is None else "adaptive" for o in chosen]
    # candidates, best worth per cost first: (-ratio, row, first j, last j, worth, cost);
    # a row's first item is the prefix that pays its round cost (``once``) best, then
    # one position at a time.
    heap = [_first_item(i, o, v, rows[i].reach) for i, o in enumerate(chosen) if o is not None]
    heapq.heapify(heap)
    spent = 0.0 if room is None else view.sigma  # against the first token's room
    E, F = float(B), 1.0 + view.sigma            # tokens, plain steps (σ paid once)
    e_row = [1.0] * len(rows)                    # E[N] per row
    ver = [0] * len(rows)                        # for the lazy latency heap
    slack = view.tpot_limit
    bounds = [(slack + r.credit, i, 0) for i, r in enumerate(rows)]
    heapq.heapify(bounds)
    k = [0] * len(rows)
    spent_row = [0.0] * len(rows)                # plain steps each row's positions cost
    order: list[int] = []
    while heap:
        neg, i, j0, j1, worth, c = heapq.heappop(heap)
        o = chosen[i]
        if view.adaptive and -neg <= E / F:
            break  # no later item raises the goodput
        extra = c + (o.now - o.once if j0 == 1 else 0.0)
        if room is not None and spent + extra > room:
            why[i] = why[i] if k[i] else "first_token"
            continue  # this row's later positions depend on these: dropped with them
        if view.adaptive and not _within(bounds, rows, e_row, ver, i, worth, F + c, slack):
            why[i] = why[i] if k[i] else "latency"
            continue
        k[i], E, F, spent = j1, E + worth, F + c, spent + extra
        spent_row[i] += c
        why[i] = ""
        order.extend([i] * (j1 - j0 + 1))
        if j1 < o.k:
            w = o.alpha ** (j1 + 1)
            c = _cost(o, v, rows[i].reach, w)
            heapq.heappush(heap, (-w / c, i, j1 + 1, j1 + 1, w, c))
    if view.probe:
        for i, o in enumerate(chosen):
            c = 0.0 if o is None else _cost(o, v, rows[i].reach, o.alpha)
            if o is not None and not k[i] and (room is None or spent + c + o.now <= room):
                k[i], spent, F, E = 1, spent + c + o.now, F + c + o.once, E + o.alpha
                why[i] = ""
                order.append(i)
    elif view.adaptive and any(k) and E / F <= B * (1.0 + MIN_GAIN):
        # "batch" for a row whose positions would pay for a step of its own, σ included
        # (the rest of the batch made the step not pay), else "adaptive"
        why = [w if not ki else "batch" if e_row[i] / (1.0 + view.sigma + B * spent_row[i])
               > 1.0 + MIN_GAIN else "adaptive" for i, (ki, w) in enumerate(zip(k, why))]
        return Decision([NONE] * len(rows), why, [])
    return Decision([(chosen[i].source, ki) if ki else NONE for i, ki in enumerate(k)], why, order)


def _cost(o: Offer, v: float, reach: float, worth: float) -> float:
    """Plain steps a position of worth α^j costs: its verify token, its source's cost and,
    on a sampled row, the pipeline on the next position, reached as often as it is worth."""
    return max(v + o.cost + reach * worth, 1e-12)


def _first_item(i: int, o: Offer, v: float, reach: float = 0.0) -> tuple:
    """Row ``i``'s first candidate: positions 1..m of best worth per cost, ``once`` included."""
    best, worth, p, cost = None, 0.0, 1.0, o.once
    for m in range(1, o.k + 1):
        p *= o.alpha
        worth += p
        cost += _cost(o, v, reach, p)
        if best is not None and worth / cost <= -best[0]:
            break  # the ratio of a prefix rises then falls: the first fall is the peak
        best = (-worth / cost, i, 1, m, worth, cost)
    return best


def _choose(offers: list[Offer], v: float, batch: int, reach: float = 0.0) -> Offer | None:
    """The offer of larger net gain Σ_{j<=k} (α^j - c_j·B) at its best k (ties: the first)."""
    best, best_gain = None, float("-inf")
    for o in offers:
        if o.k < 1:
            continue
        gain, p = -o.once * batch, 1.0
        for _ in range(o.k):
            p *= o.alpha
            price = _cost(o, v, reach, p) * batch
            if p <= price:
                break
            gain += p - price
        if gain > best_gain:
            best, best_gain = o, gain
    return best


def _within(bounds: list, rows: list[RowView], e_row: list[float], ver: list[int], i: int,
            worth: float, f_new: float, slack: float) -> bool:
    """A step of ``f_new`` keeps every row within its bound once row ``i`` gains ``worth``
    (then booked); ``bounds``: lazy min-heap of (tpot_limit·E[N_r] + credit_r, r, version)."""
    e_row[i] += worth
    ver[i] += 1
    heapq.heappush(bounds, (slack * e_row[i] + rows[i].credit, i, ver[i]))
    while bounds[0][2] != ver[bounds[0][1]]:
        heapq.heappop(bounds)
    if f_new <= bounds[0][0]:
        return True
    e_row[i] -= worth
    ver[i] += 1
    heapq.heappush(bounds, (slack * e_row[i] + rows[i].credit, i, ver[i]))
    return False


@dataclass(frozen=True, slots=True)
class Hint:
    """The decision as the scheduler applies it to a step whose prompts only it knows:
    ``price`` (a, b, p, q s of ``StepCost.target``; s0, s1 of σ), ``share`` (half of
    ttft_limit - 1), each kept position's request id in the policy's order."""

    price: tuple[float, float, float, float, float, float] | None
    share: float
    ranking: tuple[str, ...]


def verify_cap(hint: Hint, decode_rows: int, prefill_tokens: float,
               beside_prompt: bool = True) -> int | None:
    """Verify tokens a step with ``decode_rows`` and ``prefill_tokens`` may keep: with σ,
    at most ``hint.share`` of its predicted time (None without a fit). ``beside_prompt``:
    the step carries those prompt tokens, so it is compute-bound and a verify token
    costs what a prompt token does (the fit's b, from decode steps, is far less: 0.13
    against 3.8 ms on the bench pair); else it is the decode step a next prompt waits
    for, ``prefill_tokens`` only sizing the room."""
    if hint.price is None or hint.price[1] <= 0:
        return None
    a, b, p, q, s0, s1 = hint.price
    step = a + (b + q) * decode_rows + p * prefill_tokens
    per_token = max(b, p) if beside_prompt and prefill_tokens else b
    return max(0, int((hint.share * step - s0 - s1 * decode_rows) / per_token))


def keep(hint: Hint, cap: int) -> dict[str, int]:
    """Drafts each request keeps: the first ``cap`` positions of the policy's order."""
    return dict(Counter(hint.ranking[:cap]))


class ProbeSchedule:
    """When held rows are probed: a ``Backoff`` ticking on steps that priced a row out;
    a step verifying by the policy's rule resets it, a probe not followed by one doubles it."""

    def __init__(self) -> None:
        self._backoff = Backoff(PROBE_EVERY, PROBE_MAX)
        self._held = False    # the last decided step priced a row out
        self._probed = False  # the last decided step was a probe

    def probe(self) -> bool:
        return self._held and self._backoff.tick()

    def decided(self, decision: Decision, probe: bool) -> None:
        if not probe and decision.order:  # verified by the policy's own rule
            self._backoff.succeeded()
        elif self._probed:
            self._backoff.failed()
        self._probed = probe
        self._held = any(w in ("adaptive", "batch") for w in decision.why)


class PlanningCost:
    """The host-time term: per batch bucket (powers of two), the decayed mean of target s a
    planned step saved less planning's host s; below 0 over ``HOST_MIN_STEPS`` steps, the
    bucket is skipped. A probe is a trial: the bucket plans again from fresh evidence and
    is skipped again only if that new window is below 0 (its backoff then doubles)."""

    def __init__(self) -> None:
        self._net: dict[int, DecayedRate] = {}
        self._probes: dict[int, Backoff] = {}  # the buckets being skipped
        self._trials: dict[int, Backoff] = {}  # the buckets on trial, with their backoff
        self._host = DecayedRate(HOST_DECAY)   # host seconds per planned step, any batch
        self._pending: tuple[int, float] | None = None
        self.probing = False  # the last ``plan`` began a skipped bucket's trial

    def plan(self, batch: int, room_s: float | None = None) -> bool:
        """Whether to plan a step at ``batch`` rows (``room_s``: the first token's room, s)."""
        self.probing = False
        if room_s is not None and self._host.den and room_s < self._host.value(0.0, 0.0):
            return False
        key = batch.bit_length()
        backoff = self._probes.get(key)
        if backoff is None:
            return True
        if not backoff.tick():
            return False
        # One step decides nothing (most sampled steps verify no draft): judge a whole
        # window again, so a bucket that pays now is not held by what it did before.
        self.probing = True
        self._trials[key] = self._probes.pop(key)
        self._net[key] = DecayedRate(HOST_DECAY)
        return True

    def planned(self, batch: int, host_s: float) -> None:
        """A step at ``batch`` rows took ``host_s`` to plan (``book`` pairs its saving)."""
        self._pending = (batch.bit_length(), max(host_s, 0.0))
        self._host.add(max(host_s, 0.0), 1.0)

    def book(self, saved_s: float | None) -> None:
        """Target seconds the step just verified saved (None: unmeasurable, dropped)."""
        pending, self._pending = self._pending, None
        if pending is None or saved_s is None:
            return
        key, host = pending
        net = self._net.setdefault(key, DecayedRate(HOST_DECAY))
        net.add(saved_s - host, 1.0)
        if net.den < HOST_MIN_STEPS:
            return
        if net.num >= 0:
            self._trials.pop(key, None)
            return
        backoff = self._trials.pop(key, None)
        if backoff is None:
            backoff = Backoff(PROBE_EVERY, PROBE_MAX)
        else:
            backoff.failed()
        self._probes[key] = backoff

    def skipping(self, batch: int) -> bool:
        return batch.bit_length() in self._probes
