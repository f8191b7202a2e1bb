"""Adaptive k: how many draft tokens each request gets per round (pure Python).

Rule (per engine step at batch size B, per request with acceptance estimate α):

- Tokens emitted per verification with k drafts, per-token acceptance α (geometric
  model): E[N](α,k) = (1 - α^(k+1)) / (1 - α), and k+1 at α = 1.
- Cost of one round relative to a plain (no-draft) target step at batch B:
  1 + σ(B) + k·c' + k·v(B). σ(B) = s / T(B) is the fixed cost of a step that
  verifies drafts at all (s: seconds of the exact rejection sampler, which a plain
  step does not run; the median of the last ``SPEC_WINDOW`` measurements, the very
  first skipped as it pays one-time set-up; 0 until measured).
  c'(B) = (a_d + b_d·B) / T(B): one more draft forward over B rows, in plain steps.
  A draft round of P forwards over N tokens in all takes P·a_d + N·b_d seconds
  (a forward's fixed cost, plus its cost per token), fit by exponentially weighted
  least squares without intercept (newest round weighted ``ema``). A lazy-prefill
  catch-up (a new prompt, or a request resuming after a hold) adds tokens, not
  forwards, so it does not read as dearer drafting. ``c_prime_default`` until the
  first round. The target step time is T(n) = a + b·n in n = tokens in the
  step, fit online by exponentially weighted least squares (forgetting factor
  ``fit_decay`` per sample) on every step, plain and verify. Verifying k more tokens
  per request adds k·b·B, so v(B) = b·B / (a + b·B): ~0 at small B (fixed overhead
  dominates), -> 1 at large B, which switches speculation off under load. v = 0
  until a fit exists.
- Speedup S(k) = E[N](α,k) / (1 + σ(B) + k·(c' + v(B))), S(0) = 1. k* = argmax over
  0..k_max, ties to the smaller k; k = k* if S(k*) > 1 + min_gain, else 0.
- α per request: successes = accepted, trials = accepted + (1 if accepted < drafted
  else 0) per round; α̂ = (w0·α_g + Σ d^age·succ) / (w0 + Σ d^age·trials) with
  d = ``decay`` per round of that request, w0 = ``prior_weight``, clamped to
  [0, 0.999]. The prior α_g is the global estimate: the same formula over all
  requests' rounds with prior ``prior_alpha`` and decay d per engine step that had
  rounds. Rounds with no drafts carry no information and are ignored.
- Reasons: k = 0 is "load" when even α = 0.999 gains nothing at this cost (no
  probing), else "adaptive".
- Probing, so that a request held at 0 by "adaptive" can recover: on probe steps
  every such request gets k = 1, all in the same step (a step with drafts pays σ
  once, however many rows draft). The first probe step comes ``probe_every`` steps
  after requests began to be held. After a probe step, the pooled acceptance of its
  probes decides the next interval: if drafting at that acceptance would pay (k > 0
  by the rule) it is ``probe_every`` again, else it doubles, up to ``probe_max``; so
  a server where speculation does not pay spends at most about one step in
  ``probe_max`` on probes. A paying probe that lifted rows past the rule is
  confirmed by the next step: if that step verifies no drafts (``step_verifies``:
  the batch check or another cut stopped the lifted rows), the interval doubles
  too, so probes accepted per row cannot keep a batch that never pays probing every
  ``probe_every`` steps. A step that verifies drafts by the rule also resets the
  interval (verifying steps pay σ anyway, so probing there is cheap). 0 = never
  probe.
- The batch pays σ: a verifying step's fixed cost falls on all B rows, not only on
  those that draft. So after each row's choice the step as a whole must pay
  (``batch_pays``: S_batch = (1 + Σ(E[N_i] - 1)/B) / (1 + σ + Σ k_i·cost_i/B) >
  1 + min_gain); if it does not, no row drafts this step. Probe steps are exempt.
  The same test in sums (``net_gain``) gives a bound before any row is planned: each
  row at its best k under its controller's choice (``best_net_gain``); a step whose
  bound misses (``step_may_pay``) skips the n-gram rounds and the draft plans.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Hashable

from vllm_specdec_plugin.tenancy import UNSALTED, ScopedStore

ALPHA_MAX = 0.999  # α̂ never claims certainty: a rejection always pulls it down
MIN_GAIN = 0.02  # hysteresis: speculate only if the predicted S > 1 + MIN_GAIN
_A_MIN = 1e-6  # seconds; floor of the fitted intercept, so T(B) > 0 and v(B) < 1
_MIN_VAR_N = 1e-6  # weighted variance of n below which the slope is not identifiable
_MIN_DET = 1e-4  # (relative spread of N/P)² below which the draft fit has one unknown
SPEC_WINDOW = 15  # σ: median of this many latest measurements (robust to a slow step)


def round_evidence(drafted: int, accepted: int) -> tuple[int, int]:
    """(successes, trials) of one verification of ``drafted`` drafts with ``accepted``
    accepted: successes = accepted, trials = accepted + (1 if one was rejected)."""
    if not 0 <= accepted <= drafted:
        raise ValueError(f"need 0 <= accepted <= drafted, got {accepted}/{drafted}")
    return accepted, accepted + (1 if accepted < drafted else 0)


def shrunk_alpha(successes: float, trials: float, prior: float, weight: float) -> float:
    """α̂ = (weight·prior + successes) / (weight + trials), clamped to [0, ALPHA_MAX]."""
    return min(max((weight * prior + successes) / (weight + trials), 0.0), ALPHA_MAX)


def expected_tokens(alpha: float, k: int) -> float:
    """E[N]: tokens emitted per verification (accepted drafts + 1) with k drafts."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha!r}, k={k!r}")
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    if alpha < 0.5:
        return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    # near α = 1, 1 - α^(k+1) cancels; expm1/log keep full precision (1 - α is exact here)
    return -math.expm1((k + 1) * math.log(alpha)) / (1.0 - alpha)


def speedup(alpha: float, k: int, cost_per_draft: float, fixed: float = 0.0) -> float:
    """S(k) = E[N] / (1 + σ + k·cost) for k >= 1, S(0) = 1: tokens per unit of
    plain-step time (1.0 = no gain).

    ``cost_per_draft`` = c' + v(B), in plain target steps per draft token;
    ``fixed`` = σ(B), the fixed cost of a step that verifies drafts, in plain steps."""
    if k == 0:
        return 1.0
    return expected_tokens(alpha, k) / (1.0 + fixed + k * cost_per_draft)


def best_k(alpha: float, cost_per_draft: float, k_max: int, min_gain: float = 0.02,
           fixed: float = 0.0) -> int:
    """argmax_k S(k) over 0..k_max (ties -> smaller k); 0 unless S(k*) > 1 + min_gain.

    Over k >= 1, S is unimodal: with F = 1 + σ, S(k+1) > S(k) iff
    g(k) = α^(k+1)(F+kc) - c·E[N](k) > 0, and g(k+1) - g(k) = α^(k+1)(α-1)(F+(k+1)c)
    <= 0, so the first non-increase is the peak. (With σ > 0, S(1) may be below
    S(0) = 1 while a larger k pays, so the walk compares neighbours, not the best.)
    """
    best, best_s, prev, e, p = 0, 1.0, float("-inf"), 1.0, 1.0
    for k in range(1, k_max + 1):
        p *= alpha
        e += p  # E[N](α,k) = Σ_{i<=k} α^i, no cancellation
        s = e / (1.0 + fixed + k * cost_per_draft)
        if s <= prev:
            break
        prev = s
        if s > best_s:
            best, best_s = k, s
    return best if best_s > 1.0 + min_gain else 0


def choose_source(candidates: dict[str, tuple[float, int, float, float]], min_gain: float,
                  allow_none: bool) -> tuple[str, int]:
    """The draft source with the best predicted speedup for one request and round.

    candidates: source -> (α, k, cost per draft token in plain steps, σ: the fixed cost
    of a verifying step in plain steps), k >= 1 drafts that source would verify (for
    n-gram: the drafts it actually found). Returns
    (source, k), the first of the best in the given order on ties; ("none", 0) when
    ``allow_none`` and no candidate reaches S > 1 + min_gain (or there is none).
    Without ``allow_none`` the best candidate is taken whatever its S.
    """
    best, best_s, best_k_ = "none", (1.0 + min_gain) if allow_none else float("-inf"), 0
    for source, (alpha, k, cost, fixed) in candidates.items():
        if k < 1:
            continue
        s = speedup(alpha, k, cost, fixed)
        if s > best_s:
            best, best_s, best_k_ = source, s, k
    return best, best_k_


def batch_pays(rows: list[tuple[float, int, float]], batch_size: int, fixed: float,
               min_gain: float = MIN_GAIN) -> bool:
    """Whether a verifying step with these drafting rows beats a plain step.

    rows: per drafting row (α, k, cost per draft token in plain steps); batch_size: B,
    all rows of the step, drafting or not; fixed: σ(B). The step's fixed cost falls on
    all B rows, however few draft, so the batch, not the row, must pay for it:
    S_batch = (1 + Σ(E[N_i] - 1)/B) / (1 + σ + Σ k_i·cost_i / B) > 1 + min_gain.
    (With every row drafting the same k this is the per-row S of ``speedup``.)
    """
    return bool(rows) and sum(net_gain(a, k, c, min_gain) for a, k, c in rows) > \
        _threshold(batch_size, fixed, min_gain)


def net_gain(alpha: float, k: int, cost_per_draft: float, min_gain: float = MIN_GAIN) -> float:
    """One drafting row's share of ``batch_pays``: E[N](α,k) - 1 - (1 + min_gain)·k·cost.

    S_batch > 1 + min_gain  <=>  Σ net_gain_i > B·(min_gain + (1 + min_gain)·σ),
    (multiply out the ratio), so rows add up and the fixed cost is the threshold."""
    return expected_tokens(alpha, k) - 1.0 - (1.0 + min_gain) * k * cost_per_draft


def best_net_gain(alpha: float, k_max: int, cost_per_draft: float,
                  min_gain: float = MIN_GAIN) -> float:
    """max over k in 0..k_max of ``net_gain`` (0 at k = 0): the most a row drafting
    at most ``k_max`` tokens at acceptance ``alpha`` can add to a step. The sum over
    a step's rows bounds every set of plans ``batch_pays`` could see, so a step whose
    bound misses the threshold can skip planning (``step_may_pay``)."""
    # net(k) = Σ_{i<=k} (α^i - scale): it grows while α^i > scale, then only falls
    best, p, scale = 0.0, 1.0, (1.0 + min_gain) * cost_per_draft
    for _ in range(k_max):
        p *= alpha
        if p <= scale:
            break
        best += p - scale
    return best


def step_may_pay(row_bounds: list[float], batch_size: int, fixed: float,
                 min_gain: float = MIN_GAIN) -> bool:
    """Whether any plans could pass ``batch_pays``: row_bounds are each row's
    ``best_net_gain`` (0 for a row that cannot draft), fixed the least σ(B) a
    verifying step could cost."""
    return sum(row_bounds) > _threshold(batch_size, fixed, min_gain)


def _threshold(batch_size: int, fixed: float, min_gain: float) -> float:
    return batch_size * (min_gain + (1.0 + min_gain) * fixed)


@dataclass(slots=True)
class AdaptiveConfig:
    """Knobs of AdaptiveK (see the module docstring for the rule)."""

    k_max: int
    prior_alpha: float = 0.6  # initial global α (before any round is observed)
    prior_weight: float = 4.0  # prior strength, in trials
    decay: float = 0.9  # weight kept by past rounds per new round
    min_gain: float = MIN_GAIN  # hysteresis: speculate only if S(k*) > 1 + min_gain
    probe_every: int = 8  # steps before the first probe of held requests; 0 = never
    probe_max: int = 128  # the probe interval doubles up to this many steps
    c_prime_default: float = 0.05  # draft cost / plain step, until measured
    ema: float = 0.2  # weight of the newest draft round in the draft-cost fit
    fit_decay: float = 0.99  # weight kept by past samples of the T(n) fit per step

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"AdaptiveConfig: {msg}")

        need(type(self.k_max) is int and 1 <= self.k_max <= 32,
             f"k_max must be an int in 1..32, got {self.k_max!r}")
        need(0.0 <= self.prior_alpha <= 1.0, f"prior_alpha must be in [0, 1], got {self.prior_alpha!r}")
        need(self.prior_weight > 0, f"prior_weight must be > 0 (trials), got {self.prior_weight!r}")
        need(0.0 < self.decay <= 1.0, f"decay must be in (0, 1], got {self.decay!r}")
        need(self.min_gain >= 0, f"min_gain must be >= 0, got {self.min_gain!r}")
        need(type(self.probe_every) is int and self.probe_every >= 0,
             f"probe_every must be an int >= 0 (0 disables probing), got {self.probe_every!r}")
        need(type(self.probe_max) is int and self.probe_max >= self.probe_every,
             f"probe_max must be an int >= probe_every, got {self.probe_max!r}")
        need(self.c_prime_default >= 0, f"c_prime_default must be >= 0, got {self.c_prime_default!r}")
        need(0.0 < self.ema <= 1.0, f"ema must be in (0, 1], got {self.ema!r}")
        need(0.0 < self.fit_decay <= 1.0, f"fit_decay must be in (0, 1], got {self.fit_decay!r}")


class _DraftCost:
    """Draft round seconds ≈ P·a_d + N·b_d for P forwards over N tokens in all,
    fit by exponentially weighted least squares without intercept (forgetting
    ``forget`` per round), a_d, b_d >= 0. While every round so far had the same
    N/P the two cannot be told apart: then b_d = 0 (a forward costs what it cost)."""

    __slots__ = ("forget", "pp", "pn", "nn", "py", "ny", "fit")

    def __init__(self, forget: float) -> None:
        self.forget = forget
        self.pp = self.pn = self.nn = self.py = self.ny = 0.0
        self.fit: tuple[float, float] | None = None  # (a_d s/forward, b_d s/token)

    def add(self, seconds: float, passes: int, tokens: int) -> None:
        f, p, n = self.forget, float(passes), float(tokens)
        self.pp = f * self.pp + p * p
        self.pn = f * self.pn + p * n
        self.nn = f * self.nn + n * n
        self.py = f * self.py + p * seconds
        self.ny = f * self.ny + n * seconds
        det = self.pp * self.nn - self.pn * self.pn
        a = b = -1.0
        if det > _MIN_DET * self.pp * self.nn:  # N/P has varied: both identifiable
            a = (self.py * self.nn - self.ny * self.pn) / det
            b = (self.pp * self.ny - self.pn * self.py) / det
        if b < 0:  # not identifiable, or noise: all on the forward
            a, b = self.py / self.pp, 0.0
        elif a < 0:
            a, b = 0.0, self.ny / self.nn
        self.fit = (a, b)


class _Req:
    __slots__ = ("succ", "trials", "scope")

    def __init__(self, scope: Hashable | None = UNSALTED) -> None:
        self.succ = 0.0  # decayed Σ successes
        self.trials = 0.0  # decayed Σ trials
        self.scope = scope  # whose pooled α is its prior (tenancy.scope_key)


class AdaptiveK:
    """Per-request, per-round choice of k from measured acceptance and step costs.

    Call order per engine step: choose() (or begin_step() when only α and the costs are
    read, as hybrid without adaptive k does) -> observe_draft_step() ->
    observe_target_step() (and observe_spec_overhead() after a verifying step) ->
    observe_round() per request; forget() when a request finishes (else it is kept)."""

    def __init__(self, config: AdaptiveConfig) -> None:
        self.cfg = config
        self._reqs: dict[str, _Req] = {}
        # pooled [Σ successes, Σ trials] per scope (tenancy): one tenant's acceptance
        # never sets another's prior; each pool decays at its first round of a step
        self._pools: ScopedStore[list[float]] = ScopedStore(lambda: [0.0, 0.0])
        self._decayed: set[Hashable] = set()
        # T(n) fit: exponentially weighted Welford (centred, so no cancellation)
        self._w = 0.0
        self._mn = self._mt = self._cnn = self._cnt = 0.0
        self._a: float | None = None  # seconds
        self._b = 0.0  # seconds per token
        self._b_good: float | None = None  # last identifiable slope
        self._draft_cost = _DraftCost(1.0 - config.ema)
        self._spec_s: float | None = None  # seconds a verifying step adds (σ·T)
        self._spec_samples: deque[float] = deque(maxlen=SPEC_WINDOW)
        self._spec_first_seen = False
        # probing: steps counted by choose() (not under load), next probe step
        self._step = 0
        self._probe_interval = config.probe_every
        self._next_probe: int | None = None  # None while no request is held at 0
        self._probed: tuple[str, ...] = ()  # the requests probed at the last probe step
        self._probing: set[str] = set()  # of those, the ones not yet observed
        self._probe_step: int | None = None  # that step, until its outcome is booked
        self._probe_succ = self._probe_trials = 0.0
        # (probe step, doubled interval) while a paying probe awaits the next step's verdict
        self._unconfirmed: tuple[int, int] | None = None

    # -- acceptance -------------------------------------------------------------
    def join(self, req_id: str, scope: Hashable | None) -> None:
        """A new request, pooled with the others of ``scope`` (None: with none)."""
        if req_id not in self._reqs:
            self._reqs[req_id] = _Req(scope)

    def observe_round(self, req_id: str, drafted: int, accepted: int) -> None:
        """Record one verification: ``drafted`` draft tokens, ``accepted`` of them."""
        succ, trials = round_evidence(drafted, accepted)
        if drafted == 0:
            return  # no information; decaying would drift α̂ to the prior
        if req_id in self._probing:
            self._probing.discard(req_id)
            self._probe_succ += succ
            self._probe_trials += trials
        d = self.cfg.decay
        r = self._reqs.get(req_id)
        if r is None:
            r = self._reqs[req_id] = _Req()
        r.succ = d * r.succ + succ
        r.trials = d * r.trials + trials
        pool = self._pools.get(r.scope)
        if r.scope not in self._decayed:
            pool[0] *= d
            pool[1] *= d
            self._decayed.add(r.scope)
        pool[0] += succ
        pool[1] += trials

    def global_alpha(self, scope: Hashable | None = UNSALTED) -> float:
        """Acceptance estimate over the requests of ``scope`` (their prior); the
        configured prior for a scope without rounds (or None)."""
        c = self.cfg
        pool = self._pools.peek(scope) or (0.0, 0.0)
        return shrunk_alpha(pool[0], pool[1], c.prior_alpha, c.prior_weight)

    def alpha(self, req_id: str) -> float:
        """α̂ of a request; its scope's pooled estimate for one never observed."""
        r = self._reqs.get(req_id)
        if r is None:
            return self.global_alpha()
        g = self.global_alpha(r.scope)
        return shrunk_alpha(r.succ, r.trials, g, self.cfg.prior_weight)

    def scope_of(self, req_id: str) -> Hashable | None:
        r = self._reqs.get(req_id)
        return None if r is None else r.scope

    def forget(self, req_id: str) -> None:
        """Drop a finished request's state (no-op if unknown)."""
        self._reqs.pop(req_id, None)

    # -- costs ------------------------------------------------------------------
    def observe_target_step(self, seconds: float, num_tokens: int) -> None:
        """One target forward (plain or verify): wall seconds, tokens in the step."""
        if not seconds >= 0 or num_tokens < 1:
            raise ValueError(f"need seconds >= 0 and num_tokens >= 1, got {seconds!r}, {num_tokens!r}")
        self._w = self.cfg.fit_decay * self._w + 1.0
        dn, dt = num_tokens - self._mn, seconds - self._mt
        self._mn += dn / self._w
        self._mt += dt / self._w
        f = self.cfg.fit_decay
        self._cnn = f * self._cnn + dn * (num_tokens - self._mn)
        self._cnt = f * self._cnt + dn * (seconds - self._mt)
        if self._cnn / self._w > _MIN_VAR_N:
            self._b_good = self._cnt / self._cnn
        # no spread in n yet: keep the last slope seen, else assume flat (v = 0)
        b = max(self._b_good or 0.0, 0.0)  # a slower step with fewer tokens is noise
        self._b = b
        self._a = max(self._mt - b * self._mn, _A_MIN)

    def step_time(self, num_tokens: float) -> float | None:
        """Fitted T(n) in seconds; None before any target step."""
        return None if self._a is None else self._a + self._b * num_tokens

    def observe_draft_step(self, seconds: float, num_forwards: int, num_tokens: int) -> None:
        """One draft round: wall seconds of ``num_forwards`` forwards that ran
        ``num_tokens`` tokens in all (catch-up prefill plus one per drafting row per
        later forward)."""
        if not seconds >= 0 or num_forwards < 0 or num_tokens < num_forwards:
            raise ValueError(f"bad draft step: seconds={seconds!r}, forwards={num_forwards!r}, "
                             f"tokens={num_tokens!r}")
        if num_forwards:
            self._draft_cost.add(seconds, num_forwards, num_tokens)

    def observe_spec_overhead(self, seconds: float) -> None:
        """Seconds a step spent on what only a verifying step runs (the exact
        rejection sampler), measured on a step that verified drafts."""
        if not seconds >= 0:
            raise ValueError(f"need seconds >= 0, got {seconds!r}")
        if not self._spec_first_seen:  # the first exact call imports and allocates
            self._spec_first_seen = True
            return
        self._spec_samples.append(seconds)
        self._spec_s = statistics.median(self._spec_samples)

    def fixed_cost(self, batch_size: int) -> float:
        """σ(B): the fixed cost of a verifying step, in plain steps at batch B."""
        t = self.step_time(batch_size)
        if self._spec_s is None or not t:
            return 0.0
        return self._spec_s / t

    def c_prime(self, batch_size: int) -> float:
        """c'(B): one more draft forward over ``batch_size`` rows, in plain target
        steps at that batch (``c_prime_default`` before a draft round and a target fit)."""
        t, fit = self.step_time(batch_size), self._draft_cost.fit
        if fit is None or not t:
            return self.cfg.c_prime_default
        return (fit[0] + fit[1] * batch_size) / t

    def load_cost(self, batch_size: int) -> float:
        """v(B) = b·B / (a + b·B): extra verify cost per draft token, in plain steps."""
        if self._a is None:
            return 0.0
        bb = self._b * batch_size
        return bb / (self._a + bb)

    def cost_per_draft(self, batch_size: int) -> float:
        """c' + v(B): cost of one more draft token per request, in plain target steps."""
        return self.c_prime(batch_size) + self.load_cost(batch_size)

    # -- decision ---------------------------------------------------------------
    def begin_step(self) -> None:
        """A new engine step: each scope's pooled sums decay once, at its first round.
        choose() calls it; call it directly when only the estimates are used."""
        self._decayed.clear()

    def choose(self, req_ids: list[str], batch_size: int) -> dict[str, tuple[int, str]]:
        """k per request for this step: req_id -> (k, reason); reason "" if k > 0,
        "adaptive" if α is too low, "load" if no α could pay for drafts at this batch."""
        self.begin_step()
        self._unconfirmed = None  # step_verifies was not told about the last step
        c = self.cfg
        cost, fixed = self.cost_per_draft(batch_size), self.fixed_cost(batch_size)
        if best_k(ALPHA_MAX, cost, c.k_max, c.min_gain, fixed) == 0:
            return {rid: (0, "load") for rid in req_ids}  # no probes under load
        self._step += 1
        out: dict[str, tuple[int, str]] = {}
        held: list[str] = []
        reqs, w = self._reqs, c.prior_weight
        wg: dict[Hashable | None, float] = {}  # once per scope and step, not per request
        for rid in req_ids:
            r = reqs.get(rid)
            if r is None:
                r = reqs[rid] = _Req()
            if r.scope not in wg:
                wg[r.scope] = w * self.global_alpha(r.scope)
            a = min(max((wg[r.scope] + r.succ) / (w + r.trials), 0.0), ALPHA_MAX)  # == self.alpha(rid)
            k = best_k(a, cost, c.k_max, c.min_gain, fixed)
            out[rid] = (k, "") if k > 0 else (0, "adaptive")
            if k == 0:
                held.append(rid)
        self._probe(held, out=out, cost=cost, fixed=fixed)
        return out

    @property
    def probing(self) -> bool:
        """The last choose() gave held requests probe drafts (k = 1)."""
        return self._probe_step is not None and self._probe_step == self._step

    def step_verifies(self, verifies: bool) -> None:
        """Tell the controller whether the step just planned verifies drafts at all
        (after every cut the caller makes: its batch check, grammar, draft KV pool).
        A verifying step pays σ anyway, so probing held requests is cheap again: the
        interval resets to ``probe_every``. A probe step does not count (its outcome
        sets the interval), and the step after a paying probe that lifted rows
        confirms it: if that step does not verify, the interval doubles as for a
        probe that did not pay."""
        c = self.cfg
        if self._unconfirmed is not None:
            probe_step, doubled = self._unconfirmed
            self._unconfirmed = None
            if not verifies and not self.probing:
                self._probe_interval = doubled
                if self._next_probe is not None:
                    self._next_probe = probe_step + doubled
                return
        if verifies and c.probe_every and not self.probing:
            self._probe_interval = c.probe_every
            if self._next_probe is not None:
                self._next_probe = min(self._next_probe, self._step + c.probe_every)

    def _probe(self, held: list[str], out: dict, cost: float, fixed: float) -> None:
        """Give every held request k = 1 on probe steps (see the module docstring)."""
        c = self.cfg
        if self._probe_step is not None:  # book the last probe step's outcome
            trials = self._probe_trials
            paid = trials > 0 and best_k(min(self._probe_succ / trials, ALPHA_MAX), cost,
                                         c.k_max, c.min_gain, fixed) > 0
            doubled = min(2 * self._probe_interval, c.probe_max)
            self._probe_interval = c.probe_every if paid else doubled
            if paid and any(out[rid][0] for rid in self._probed if rid in out):
                # it lifted rows past the rule; step_verifies tells whether the batch
                # lets them draft (a probe that lifted none only adds evidence)
                self._unconfirmed = (self._probe_step, doubled)
            self._next_probe = self._probe_step + self._probe_interval
            self._probe_step, self._probing, self._probed = None, set(), ()
            self._probe_succ = self._probe_trials = 0.0
        if not held or not c.probe_every:
            self._next_probe = None
            return
        if self._next_probe is None:
            self._next_probe = self._step + self._probe_interval - 1
        if self._step < self._next_probe:
            return
        for rid in held:
            out[rid] = (1, "")
        self._probed = tuple(held)
        self._probing = set(held)
        self._probe_step = self._step

    def _pooled_alpha(self) -> float:
        """α over every scope's rounds (for metrics and logs only)."""
        succ = sum(p[0] for p in self._pools.values())
        trials = sum(p[1] for p in self._pools.values())
        return shrunk_alpha(succ, trials, self.cfg.prior_alpha, self.cfg.prior_weight)

    def snapshot(self) -> dict:
        """For metrics/logs: a (s), b (s/token), spec_s (s), draft_a (s per draft
        forward), draft_b (s per draft token), c_prime (at batch 1), global_alpha,
        probe_interval (steps), tracked_requests."""
        fit = self._draft_cost.fit
        return {
            "a": self._a,
            "b": self._b,
            "spec_s": self._spec_s,
            "draft_a": None if fit is None else fit[0],
            "draft_b": None if fit is None else fit[1],
            "c_prime": self.c_prime(1),
            "probe_interval": self._probe_interval,
            "global_alpha": self._pooled_alpha(),
            "tracked_requests": len(self._reqs),
        }
