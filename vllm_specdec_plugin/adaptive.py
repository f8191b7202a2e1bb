"""Adaptive k: how many draft tokens each request gets per round (pure Python).

Rule (per engine step at batch size B, per request with acceptance estimate α):

- Tokens emitted per verification with k drafts, per-token acceptance α (geometric
  model): E[N](α,k) = (1 - α^(k+1)) / (1 - α), and k+1 at α = 1.
- Cost of one round relative to a plain (no-draft) target step at batch B:
  1 + k·c' + k·v(B). c' = draft seconds per draft forward / T(B_draft), an EMA
  (weight ``ema``) of ratios measured at each draft round; ``c_prime_default``
  until the first one. The target step time is T(n) = a + b·n in n = tokens in the
  step, fit online by exponentially weighted least squares (forgetting factor
  ``fit_decay`` per sample) on every step, plain and verify. Verifying k more tokens
  per request adds k·b·B, so v(B) = b·B / (a + b·B): ~0 at small B (fixed overhead
  dominates), -> 1 at large B, which switches speculation off under load. v = 0
  until a fit exists.
- Speedup S(k) = E[N](α,k) / (1 + k·(c' + v(B))), S(0) = 1. k* = argmax over
  0..k_max, ties to the smaller k; k = k* if S(k*) > 1 + min_gain, else 0.
- α per request: successes = accepted, trials = accepted + (1 if accepted < drafted
  else 0) per round; α̂ = (w0·α_g + Σ d^age·succ) / (w0 + Σ d^age·trials) with
  d = ``decay`` per round of that request, w0 = ``prior_weight``, clamped to
  [0, 0.999]. The prior α_g is the global estimate: the same formula over all
  requests' rounds with prior ``prior_alpha`` and decay d per engine step that had
  rounds. Rounds with no drafts carry no information and are ignored.
- Reasons: k = 0 is "load" when even α = 0.999 gains nothing at this cost (no
  probing), else "adaptive"; a request held at 0 by "adaptive" gets k = 1 on every
  ``probe_every``-th such round (0 = never) so that its α can recover.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA_MAX = 0.999  # α̂ never claims certainty: a rejection always pulls it down
MIN_GAIN = 0.02  # hysteresis: speculate only if the predicted S > 1 + MIN_GAIN
_A_MIN = 1e-6  # seconds; floor of the fitted intercept, so T(B) > 0 and v(B) < 1
_MIN_VAR_N = 1e-6  # weighted variance of n below which the slope is not identifiable


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


def speedup(alpha: float, k: int, cost_per_draft: float) -> float:
    """S(k) = E[N] / (1 + k·cost): tokens per unit of plain-step time (1.0 = no gain).

    ``cost_per_draft`` = c' + v(B), in plain target steps per draft token."""
    return expected_tokens(alpha, k) / (1.0 + k * cost_per_draft)


def best_k(alpha: float, cost_per_draft: float, k_max: int, min_gain: float = 0.02) -> int:
    """argmax_k S(k) over 0..k_max (ties -> smaller k); 0 unless S(k*) > 1 + min_gain.

    S is unimodal in k: S(k+1) > S(k) iff g(k) = α^(k+1)(1+kc) - c·E[N](k) > 0 and
    g(k+1) - g(k) = α^(k+1)(α-1)(1+(k+1)c) <= 0, so the first non-increase is the peak.
    """
    best, best_s, e, p = 0, 1.0, 1.0, 1.0
    for k in range(1, k_max + 1):
        p *= alpha
        e += p  # E[N](α,k) = Σ_{i<=k} α^i, no cancellation
        s = e / (1.0 + k * cost_per_draft)
        if s <= best_s:
            break
        best, best_s = k, s
    return best if best_s > 1.0 + min_gain else 0


def choose_source(candidates: dict[str, tuple[float, int, float]], min_gain: float,
                  allow_none: bool) -> tuple[str, int]:
    """The draft source with the best predicted speedup for one request and round.

    candidates: source -> (α, k, cost per draft token in plain steps), k >= 1 drafts
    that source would verify (for n-gram: the drafts it actually found). Returns
    (source, k), the first of the best in the given order on ties; ("none", 0) when
    ``allow_none`` and no candidate reaches S > 1 + min_gain (or there is none).
    Without ``allow_none`` the best candidate is taken whatever its S.
    """
    best, best_s, best_k_ = "none", (1.0 + min_gain) if allow_none else float("-inf"), 0
    for source, (alpha, k, cost) in candidates.items():
        if k < 1:
            continue
        s = speedup(alpha, k, cost)
        if s > best_s:
            best, best_s, best_k_ = source, s, k
    return best, best_k_


@dataclass(slots=True)
class AdaptiveConfig:
    """Knobs of AdaptiveK (see the module docstring for the rule)."""

    k_max: int
    prior_alpha: float = 0.6  # initial global α (before any round is observed)
    prior_weight: float = 4.0  # prior strength, in trials
    decay: float = 0.9  # weight kept by past rounds per new round
    min_gain: float = MIN_GAIN  # hysteresis: speculate only if S(k*) > 1 + min_gain
    probe_every: int = 8  # rounds between k=1 probes of a low-α request; 0 = never
    c_prime_default: float = 0.05  # draft cost / plain step, until measured
    ema: float = 0.2  # weight of the newest draft-cost measurement
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
        need(self.c_prime_default >= 0, f"c_prime_default must be >= 0, got {self.c_prime_default!r}")
        need(0.0 < self.ema <= 1.0, f"ema must be in (0, 1], got {self.ema!r}")
        need(0.0 < self.fit_decay <= 1.0, f"fit_decay must be in (0, 1], got {self.fit_decay!r}")


class _Req:
    __slots__ = ("succ", "trials", "streak")

    def __init__(self) -> None:
        self.succ = 0.0  # decayed Σ successes
        self.trials = 0.0  # decayed Σ trials
        self.streak = 0  # rounds held at k=0 for low α (drives probing)


class AdaptiveK:
    """Per-request, per-round choice of k from measured acceptance and step costs.

    Call order per engine step: choose() (or begin_step() when only α and the costs are
    read, as hybrid without adaptive k does) -> observe_draft_step() ->
    observe_target_step() -> observe_round() per request; forget() when a request
    finishes (else it is kept)."""

    def __init__(self, config: AdaptiveConfig) -> None:
        self.cfg = config
        self._reqs: dict[str, _Req] = {}
        self._g_succ = 0.0
        self._g_trials = 0.0
        self._g_new_step = True  # decay the global sums at the first round of a step
        # T(n) fit: exponentially weighted Welford (centred, so no cancellation)
        self._w = 0.0
        self._mn = self._mt = self._cnn = self._cnt = 0.0
        self._a: float | None = None  # seconds
        self._b = 0.0  # seconds per token
        self._b_good: float | None = None  # last identifiable slope
        self._c_prime: float | None = None

    # -- acceptance -------------------------------------------------------------
    def observe_round(self, req_id: str, drafted: int, accepted: int) -> None:
        """Record one verification: ``drafted`` draft tokens, ``accepted`` of them."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got {accepted}/{drafted}")
        if drafted == 0:
            return  # no information; decaying would drift α̂ to the prior
        succ, trials = accepted, accepted + (1 if accepted < drafted else 0)
        d = self.cfg.decay
        r = self._reqs.get(req_id)
        if r is None:
            r = self._reqs[req_id] = _Req()
        r.succ = d * r.succ + succ
        r.trials = d * r.trials + trials
        if self._g_new_step:
            self._g_succ *= d
            self._g_trials *= d
            self._g_new_step = False
        self._g_succ += succ
        self._g_trials += trials

    def global_alpha(self) -> float:
        """Acceptance estimate over all requests (the per-request prior)."""
        c = self.cfg
        g = (c.prior_weight * c.prior_alpha + self._g_succ) / (c.prior_weight + self._g_trials)
        return min(max(g, 0.0), ALPHA_MAX)

    def alpha(self, req_id: str) -> float:
        """α̂ of a request; the global estimate for one never observed."""
        r = self._reqs.get(req_id)
        g = self.global_alpha()
        if r is None:
            return g
        w = self.cfg.prior_weight
        return min(max((w * g + r.succ) / (w + r.trials), 0.0), ALPHA_MAX)

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

    def observe_draft_step(self, seconds: float, num_forwards: int, batch_size: int) -> None:
        """One draft round: wall seconds of ``num_forwards`` forwards over ``batch_size`` requests."""
        if not seconds >= 0 or num_forwards < 0 or batch_size < 1:
            raise ValueError(f"bad draft step: seconds={seconds!r}, forwards={num_forwards!r}, "
                             f"batch={batch_size!r}")
        t = self.step_time(batch_size)
        if num_forwards == 0 or t is None:
            return  # nothing to divide by yet
        ratio = seconds / num_forwards / t
        e = self.cfg.ema
        self._c_prime = ratio if self._c_prime is None else (1 - e) * self._c_prime + e * ratio

    def c_prime(self) -> float:
        """Draft cost per draft token, in plain target steps."""
        return self.cfg.c_prime_default if self._c_prime is None else self._c_prime

    def load_cost(self, batch_size: int) -> float:
        """v(B) = b·B / (a + b·B): extra verify cost per draft token, in plain steps."""
        if self._a is None:
            return 0.0
        bb = self._b * batch_size
        return bb / (self._a + bb)

    def cost_per_draft(self, batch_size: int) -> float:
        """c' + v(B): cost of one more draft token per request, in plain target steps."""
        return self.c_prime() + self.load_cost(batch_size)

    # -- decision ---------------------------------------------------------------
    def begin_step(self) -> None:
        """A new engine step: the global acceptance sums decay once at its first round.
        choose() calls it; call it directly when only the estimates are used."""
        self._g_new_step = True

    def choose(self, req_ids: list[str], batch_size: int) -> dict[str, tuple[int, str]]:
        """k per request for this step: req_id -> (k, reason); reason "" if k > 0,
        "adaptive" if α is too low, "load" if no α could pay for drafts at this batch."""
        self.begin_step()
        c = self.cfg
        cost = self.cost_per_draft(batch_size)
        if best_k(ALPHA_MAX, cost, c.k_max, c.min_gain) == 0:
            return {rid: (0, "load") for rid in req_ids}  # streaks pause: no probes under load
        out: dict[str, tuple[int, str]] = {}
        reqs, w = self._reqs, c.prior_weight
        wg = w * self.global_alpha()  # once per step, not per request
        for rid in req_ids:
            r = reqs.get(rid)
            if r is None:
                r = reqs[rid] = _Req()
            a = min(max((wg + r.succ) / (w + r.trials), 0.0), ALPHA_MAX)  # == self.alpha(rid)
            k = best_k(a, cost, c.k_max, c.min_gain)
            if k > 0:
                r.streak = 0
                out[rid] = (k, "")
                continue
            r.streak += 1
            if c.probe_every and r.streak % c.probe_every == 0:
                out[rid] = (1, "")
            else:
                out[rid] = (0, "adaptive")
        return out

    def snapshot(self) -> dict:
        """For metrics/logs: a (s), b (s/token), c_prime, global_alpha, tracked_requests."""
        return {
            "a": self._a,
            "b": self._b,
            "c_prime": self.c_prime(),
            "global_alpha": self.global_alpha(),
            "tracked_requests": len(self._reqs),
        }
