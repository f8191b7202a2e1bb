"""What catching up a lagging draft KV costs a draft-model round (pure Python).

The draft sees a request's committed tokens only when a draft-model round feeds them
(lazy prefill): a new request's prompt, and in hybrid mode every token committed while
n-gram drafts (or none) were verified. A round's first pass feeds that lag before the
draft can propose, and every row of the step waits for it: at chat c = 16 on the smol
pair one round fed 1,061 tokens to verify seven k = 1 drafts (105-146 ms, 1-2 target
steps; ``experiments/host_time/draft_rounds.py``).

The catch-up is paid once; the rounds after it feed only what they commit. So it is
priced as an investment spread over the rounds the request has left:

    cost per round = lag · price / max(1, horizon / E[N](α, k))

in plain steps, with price = B · b_c / T(B) (a token fed delays all B rows:
``StepCost.catch_up_cost``; b_c from ``CatchUpFit``), lag the tokens fed beyond the
one a drafting row feeds anyway, and horizon the tokens the request may still emit:
up to its max_tokens, and at most the median output of its scope's finished requests
(``OutputLengths``), so a client that sends no max_tokens does not make a catch-up
look free.
"""

from __future__ import annotations

import statistics
from collections import deque

from vllm_specdec_plugin.speedup import expected_tokens
from vllm_specdec_plugin.tuning import MIN_VAR_TOKENS, OUTPUT_WINDOW


def round_cost(lag: int, price: float, horizon: int, alpha: float, k: int) -> float:
    """Plain steps a round pays for feeding ``lag`` tokens at ``price`` plain steps a
    token, spread over the ``horizon`` tokens left (E[N](α, k) a round); 0 without lag."""
    if lag <= 0 or price <= 0:
        return 0.0
    return lag * price / max(1.0, horizon / expected_tokens(alpha, k))


class CatchUpFit:
    """Seconds of a draft round's first pass ≈ a_c + b_c·N for N committed tokens fed,
    fit by exponentially weighted least squares (forgetting ``forget`` per round).
    ``per_token`` is b_c; until N has varied (or where noise makes the slope <= 0) it is
    seconds / N, an upper bound: the forward's fixed cost read as tokens."""

    __slots__ = ("forget", "w", "n", "s", "nn", "ns")

    def __init__(self, forget: float) -> None:
        self.forget = forget
        # Σw, Σw·N, Σw·s, Σw·N², Σw·N·s
        self.w = self.n = self.s = self.nn = self.ns = 0.0

    def add(self, seconds: float, tokens: int) -> None:
        f = self.forget
        self.w = f * self.w + 1.0
        self.n = f * self.n + tokens
        self.s = f * self.s + seconds
        self.nn = f * self.nn + tokens * tokens
        self.ns = f * self.ns + tokens * seconds

    def per_token(self) -> float | None:
        """b_c, seconds per committed token fed; None before a round."""
        if not self.n:
            return None
        var = self.nn - self.n * self.n / self.w
        if var / self.w > MIN_VAR_TOKENS:
            b = (self.ns - self.n * self.s / self.w) / var
            if b > 0:
                return b
        return self.s / self.n


class OutputLengths:
    """Output tokens of a scope's last ``OUTPUT_WINDOW`` finished requests."""

    __slots__ = ("_recent",)

    def __init__(self) -> None:
        self._recent: deque[int] = deque(maxlen=OUTPUT_WINDOW)

    def add(self, tokens: int) -> None:
        if tokens > 0:
            self._recent.append(tokens)

    def typical(self) -> float | None:
        """The median output in tokens; None before a request finished."""
        return statistics.median(self._recent) if self._recent else None
