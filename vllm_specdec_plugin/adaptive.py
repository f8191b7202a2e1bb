"""Adaptive k: how many draft tokens each request gets per round (pure Python).

The controller: per-request and per-scope acceptance, the rule that picks k, and
probing. The mathematics is in ``speedup``; the costs come from ``step_cost``
(T(n), σ, the draft fit), shared by every controller of a proposer.

Rule (per engine step at batch size B, per request with acceptance estimate α):

- Cost of one round relative to a plain (no-draft) target step at batch B:
  1 + σ(B) + k·(c' + v(B)) (``step_cost``: σ the fixed cost of a verifying step,
  c'(B) one more draft forward over B rows, ``c_prime_default`` until measured or for
  a source that runs no draft forward, v(B) = b·B / T(B) the verify cost per draft
  token, T(B) = a + (b + q)·B the plain step: ~0 at small B and towards b / (b + q) at
  large B, which switches speculation off under load).
- Speedup S(k) = E[N](α,k) / (1 + σ(B) + k·(c' + v(B))), S(0) = 1. k* = argmax over
  0..k_max, ties to the smaller k; k = k* if S(k*) > 1 + min_gain, else 0.
- α per request: successes = accepted, trials = accepted + (1 if accepted < drafted
  else 0) per round; α̂ = (w0·α_g + Σ d^age·succ) / (w0 + Σ d^age·trials) with
  d = ``decay`` per round of that request, w0 = ``prior_weight``, clamped to
  [0, ALPHA_MAX]. The prior α_g is the estimate of the request's tenancy scope: the
  same formula over its requests' rounds with prior ``prior_alpha`` and decay d per
  engine step that had rounds. Rounds with no drafts carry no information.
- Reasons: k = 0 is "load" when even α = ALPHA_MAX gains nothing at this cost, else
  "adaptive".
- Load probes: the "load" verdict rests on the cost fit, and only a step that
  verifies at more than B tokens can revise it (a fit whose intercept collapsed
  reads every token as a whole row's cost, v(B) ~ 1, and would hold every row for
  good). So while it holds, every ``load_probe_every`` steps (doubling up to
  ``probe_max``; 0 = never) every row gets k = 1 in one step; under a true load
  that costs about one step's worth of B extra tokens per ``probe_max`` steps.
- Probing, so that a request held at 0 by "adaptive" can recover: on probe steps
  every such request gets k = 1, all in the same step (a step with drafts pays σ
  once, however many rows draft). The first probe step comes ``probe_every`` steps
  after requests began to be held. After a probe step, the pooled acceptance of its
  probes decides the next interval: if drafting at that acceptance would pay it is
  ``probe_every`` again, else it doubles, up to ``probe_max``. A paying probe that
  lifted rows past the rule is confirmed by the next step: if that step verifies no
  drafts (``step_verifies``), the interval doubles too. A step that verifies drafts
  by the rule also resets the interval (it pays σ anyway). 0 = never probe.
- The batch pays σ (``speedup.batch_pays``, ``batch_check``): the proposer's checks,
  not this class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

from vllm_specdec_plugin.speedup import best_k, round_evidence, shrunk_alpha
from vllm_specdec_plugin.step_cost import StepCost
from vllm_specdec_plugin.tenancy import UNSALTED, ScopedStore
from vllm_specdec_plugin.tuning import (ALPHA_DECAY, ALPHA_MAX, C_PRIME_DRAFT, C_PRIME_NGRAM,
                                        DRAFT_FIT_EMA, MAX_K, MIN_GAIN, PRIOR_ALPHA,
                                        PRIOR_WEIGHT, PROBE_EVERY, PROBE_MAX, STEP_FIT_DECAY)


@dataclass(slots=True)
class AdaptiveConfig:
    """Knobs of AdaptiveK (see the module docstring for the rule)."""

    k_max: int
    prior_alpha: float = PRIOR_ALPHA  # initial global α (before any round is observed)
    prior_weight: float = PRIOR_WEIGHT  # prior strength, in trials
    decay: float = ALPHA_DECAY  # weight kept by past rounds per new round
    min_gain: float = MIN_GAIN  # hysteresis: speculate only if S(k*) > 1 + min_gain
    probe_every: int = PROBE_EVERY  # steps before the first probe of held requests; 0 = never
    probe_max: int = PROBE_MAX  # the probe interval doubles up to this many steps
    load_probe_every: int = PROBE_EVERY  # steps under "load" before a load probe; 0 = never
    c_prime_default: float = C_PRIME_DRAFT  # draft cost / plain step, until measured
    measured_c_prime: bool = True  # False: the source runs no draft forward (n-gram)
    ema: float = DRAFT_FIT_EMA  # weight of the newest draft round in the draft-cost fit
    fit_decay: float = STEP_FIT_DECAY  # weight kept by past samples of the T(n) fit per step

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"AdaptiveConfig: {msg}")

        need(type(self.k_max) is int and 1 <= self.k_max <= MAX_K,
             f"k_max must be an int in 1..{MAX_K}, got {self.k_max!r}")
        need(0.0 <= self.prior_alpha <= 1.0, f"prior_alpha must be in [0, 1], got {self.prior_alpha!r}")
        need(self.prior_weight > 0, f"prior_weight must be > 0 (trials), got {self.prior_weight!r}")
        need(0.0 < self.decay <= 1.0, f"decay must be in (0, 1], got {self.decay!r}")
        need(self.min_gain >= 0, f"min_gain must be >= 0, got {self.min_gain!r}")
        need(type(self.probe_every) is int and self.probe_every >= 0,
             f"probe_every must be an int >= 0 (0 disables probing), got {self.probe_every!r}")
        need(type(self.probe_max) is int and self.probe_max >= self.probe_every,
             f"probe_max must be an int >= probe_every, got {self.probe_max!r}")
        need(type(self.load_probe_every) is int and 0 <= self.load_probe_every <= self.probe_max,
             f"load_probe_every must be an int in 0..probe_max (0 disables load probes), "
             f"got {self.load_probe_every!r}")
        need(self.c_prime_default >= 0, f"c_prime_default must be >= 0, got {self.c_prime_default!r}")
        need(0.0 < self.ema <= 1.0, f"ema must be in (0, 1], got {self.ema!r}")
        need(0.0 < self.fit_decay <= 1.0, f"fit_decay must be in (0, 1], got {self.fit_decay!r}")


class _Req:
    __slots__ = ("succ", "trials", "scope")

    def __init__(self, scope: Hashable | None = UNSALTED) -> None:
        self.succ = 0.0  # decayed Σ successes
        self.trials = 0.0  # decayed Σ trials
        self.scope = scope  # whose pooled α is its prior (tenancy.scope_key)


class AdaptiveK:
    """Per-request, per-round choice of k from measured acceptance and step costs.

    Call order per engine step: choose() (or begin_step() when only α and the costs are
    read, as hybrid without adaptive k does) -> step_verifies() -> observe_round() per
    request; forget() when a request finishes (else it is kept). The step timers feed
    ``cost`` (``step_record``)."""

    def __init__(self, config: AdaptiveConfig, cost: StepCost | None = None) -> None:
        self.cfg = config
        # the step's cost model, shared by a proposer's controllers (their own if None)
        self.cost = cost if cost is not None else StepCost(config.fit_decay, config.ema)
        self._reqs: dict[str, _Req] = {}
        # pooled [Σ successes, Σ trials] per scope (tenancy): one tenant's acceptance
        # never sets another's prior; each pool decays at its first round of a step
        self._pools: ScopedStore[list[float]] = ScopedStore(lambda: [0.0, 0.0])
        self._decayed: set[Hashable] = set()
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
        # load probes: steps under "load" since the last load probe (or since load began),
        # the interval they wait for, and whether the last choose() was one
        self._load_steps = 0
        self._load_interval = config.load_probe_every
        self._load_probe = False

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

    # -- costs, in plain target steps at batch B (``step_cost``) ---------------
    def fixed_cost(self, batch_size: int) -> float:
        """σ(B): the fixed cost of a verifying step."""
        return self.cost.fixed_cost(batch_size)

    def c_prime(self, batch_size: int) -> float:
        """c'(B): one more draft forward over B rows (``c_prime_default`` until
        measured, and always for a source that runs no draft forward)."""
        c = self.cost.c_prime(batch_size) if self.cfg.measured_c_prime else None
        return self.cfg.c_prime_default if c is None else c

    def cost_per_draft(self, batch_size: int) -> float:
        """c' + v(B): cost of one more draft token per request."""
        return self.c_prime(batch_size) + self.cost.load_cost(batch_size)

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
        self._load_probe = False
        if best_k(ALPHA_MAX, cost, c.k_max, c.min_gain, fixed) == 0:
            return self._under_load(req_ids)
        self._load_steps, self._load_interval = 0, c.load_probe_every
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

    def _under_load(self, req_ids: list[str]) -> dict[str, tuple[int, str]]:
        """Every row held for "load", or k = 1 for all on a load probe step (see the
        module docstring). The cost fit learns from the probe step's timer."""
        c = self.cfg
        self._load_steps += 1
        if not c.load_probe_every or self._load_steps < self._load_interval:
            return {rid: (0, "load") for rid in req_ids}
        self._load_steps = 0
        self._load_interval = min(2 * self._load_interval, c.probe_max)
        self._load_probe = True
        return {rid: (1, "") for rid in req_ids}

    @property
    def probing(self) -> bool:
        """The last choose() gave held requests probe drafts (k = 1): a probe or a
        load probe step."""
        return self._load_probe or (self._probe_step is not None
                                    and self._probe_step == self._step)

    @property
    def load_probing(self) -> bool:
        """The last choose() was a load probe step (every row k = 1 under "load")."""
        return self._load_probe

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
        """For metrics/logs: ``StepCost.snapshot`` plus c_prime (at batch 1),
        global_alpha, probe_interval (steps), tracked_requests."""
        return {**self.cost.snapshot(),
                "c_prime": self.c_prime(1),
                "probe_interval": self._probe_interval,
                "global_alpha": self._pooled_alpha(),
                "tracked_requests": len(self._reqs)}


def controllers_for(sources: list[str], k_max: int, prior_alpha: float,
                    cost: StepCost) -> dict[str, AdaptiveK]:
    """One controller per draft source ("draft", "ngram"), all reading ``cost``.

    Each measures its source's acceptance per request. The n-gram source runs no
    draft forward (c' = ``C_PRIME_NGRAM``, only the verify cost limits it) and needs
    no probes: shadow proposals (``shadow``) measure held rows at no target cost."""
    out = {}
    for source in sources:
        ngram = source == "ngram"
        out[source] = AdaptiveK(AdaptiveConfig(
            k_max=k_max, prior_alpha=prior_alpha,
            c_prime_default=C_PRIME_NGRAM if ngram else C_PRIME_DRAFT,
            measured_c_prime=not ngram, **({"probe_every": 0} if ngram else {})), cost)
    return out
