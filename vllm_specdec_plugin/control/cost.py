"""What a step costs, fitted from the step timers in seconds (pure Python): ``target``
a + b·n + p·m + q·R (n decode/verify tokens over R rows, m prefill tokens), ``sigma``
s0 + s1·R + s2·P (the exact sampler on a verifying step, P sampled positions it made past
each row's first; the first step, a set-up, skipped), ``draft``
d0 + d1·P + d2·N (P forwards over N tokens), ``catch_up`` c0 + c1·N (N tokens fed).
``prices``: all in plain steps at batch B, for the policy."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_specdec_plugin.control.estimators import OnlineFit
from vllm_specdec_plugin.tuning import (A_MIN, C_PRIME_DRAFT, DRAFT_FIT_DECAY,
                                        SIGMA_FIT_DECAY, STEP_FIT_DECAY, STEP_FIT_SOLVE_EVERY,
                                        STEP_FIT_SURPRISE)


@dataclass(frozen=True, slots=True)
class Prices:
    """One step's costs at batch B, in plain steps (a step without drafts = 1)."""

    plain_s: float      # T(B) in seconds: one plain step at B rows
    verify: float       # one verify token: b / T(B)
    sigma: float        # a step that verifies any draft: σ(B) / T(B)
    draft_token: float  # one drafted position of one row: a draft pass over B rows / (B·T(B))
    catch_up: float     # one committed token fed to the draft: c1 / T(B)
    prefill: float      # one prompt token in the step: p / T(B)
    sampled_position: float = 0.0  # one more position of a sampled row in σ: s2 / T(B)


class StepCost:
    """The four fits of one proposer."""

    def __init__(self) -> None:
        self.target = OnlineFit(3, STEP_FIT_DECAY, STEP_FIT_SOLVE_EVERY, STEP_FIT_SURPRISE, A_MIN)
        self.sigma = OnlineFit(2, SIGMA_FIT_DECAY)
        self.draft = OnlineFit(2, DRAFT_FIT_DECAY)
        self.catch_up = OnlineFit(1, DRAFT_FIT_DECAY)
        self._sigma_seen = False
        self._prices: dict[int, Prices] = {}
        self._key: tuple = ()

    def observe_step(self, seconds: float, n: int, m: int, rows: int, exact_s: float = 0.0,
                     verified: bool = False, positions: int = 0) -> None:
        """One target step of ``seconds`` (``exact_s`` in the exact sampler: σ when it
        ``verified`` drafts, making ``positions`` sampled positions past each row's
        first), n decode/verify tokens over ``rows`` rows, m prefill tokens."""
        if not seconds >= 0 or n < 0 or m < 0 or n + m < 1 or not 0 <= rows <= n:
            raise ValueError(f"bad step: seconds={seconds!r}, n={n!r}, m={m!r}, rows={rows!r}")
        exact_s = min(max(exact_s, 0.0), seconds)
        self.target.add(seconds - exact_s, n, m, rows)
        if verified and not m:
            if self._sigma_seen:
                self.sigma.add(exact_s, rows, positions)
            self._sigma_seen = True

    def observe_draft(self, seconds: float, passes: int, tokens: int) -> None:
        """One draft round's drafting passes: ``passes`` forwards over ``tokens``."""
        if not seconds >= 0 or passes < 0 or tokens < passes:
            raise ValueError(f"bad draft round: seconds={seconds!r}, passes={passes!r}, "
                             f"tokens={tokens!r}")
        if passes:
            self.draft.add(seconds, passes, tokens)

    def observe_catch_up(self, seconds: float, tokens: int) -> None:
        """A round's first pass: ``seconds`` to feed ``tokens`` committed tokens."""
        if not seconds >= 0 or tokens < 1:
            raise ValueError(f"bad catch-up pass: seconds={seconds!r}, tokens={tokens!r}")
        self.catch_up.add(seconds, tokens)

    def step_s(self, n: float, m: float = 0, rows: float | None = None) -> float | None:
        """Seconds of a target step (``rows`` None: a plain step, one row per token)."""
        return self.target.predict(n, m, n if rows is None else rows)

    def sigma_s(self, rows: int, positions: float = 0) -> float:
        """σ's seconds at ``rows`` rows making ``positions`` sampled positions past each
        row's first; 0 until measured."""
        return (self.sigma.predict(rows, positions) or 0.0) if self.sigma.w else 0.0

    def catch_up_per_token(self) -> float | None:
        """c1 s/token; until the fed counts varied, seconds / tokens (an upper bound);
        None before a first pass."""
        f = self.catch_up
        if not f.w:
            return None
        if f.identified(0) and f.slope(0) > 0:
            return f.slope(0)
        return f.mean[1] / max(f.mean[0], 1.0)

    def prices(self, batch: int) -> Prices:
        """Costs at ``batch`` rows in plain steps; before any target step only a draft
        position (``C_PRIME_DRAFT``), and ``plain_s`` 0."""
        for f in (self.target, self.sigma, self.draft, self.catch_up):
            f.fresh()  # a solve that is due (cadence, surprise) runs before the cache key
        key = (self.target.version, self.sigma.version, self.draft.version, self.catch_up.version)
        if key != self._key:
            self._key, self._prices = key, {}
        p = self._prices.get(batch)
        if p is None:
            b = max(batch, 1)
            plain = self.step_s(b)
            if not plain:
                return Prices(0.0, 0.0, 0.0, C_PRIME_DRAFT / b, 0.0, 0.0)
            draft = self.draft.predict(1, b)
            per_pass = C_PRIME_DRAFT * plain if draft is None else max(draft, 0.0)
            c = self.catch_up_per_token()
            if c is None:  # the draft is the smaller model: the target's prompt token errs high
                c = self.target.slope(1)
            p = self._prices[batch] = Prices(
                plain, self.target.slope(0) / plain, self.sigma_s(b) / plain,
                per_pass / (b * plain), c / plain, self.target.slope(1) / plain,
                self.sigma.slope(1) / plain)
        return p

    def catch_up_room(self, batch: int, most: float) -> int | None:
        """Tokens a draft round may feed at ``batch`` rows delaying the step <= ``most``
        plain steps (>= one a row; None for one row or unfitted). Fits only, never recent
        steps' seconds: those would let one tenant's traffic move another's drafts."""
        p = self.prices(batch) if batch > 1 else None
        if p is None or not p.catch_up:
            return None
        return max(batch, int(most / p.catch_up))

    def snapshot(self) -> dict:
        """The fits in seconds: a, b, p, q (target), sigma_s (at one row), draft_b (per
        draft token), catch_up_b (per token fed); None where unmeasured."""
        t = self.target
        t.fresh()
        return {"a": t.a, "b": t.coef[0], "p": t.coef[1], "q": t.coef[2],
                "sigma_s": self.sigma.predict(1),
                "draft_b": self.draft.slope(1) if self.draft.w else None,
                "catch_up_b": self.catch_up_per_token()}
