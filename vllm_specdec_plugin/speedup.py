"""The speedup mathematics of speculative decoding (pure Python, no vLLM).

Units: α is the per-token acceptance (geometric model); costs are in plain target
steps (a step without drafts = 1); k is drafts per request and round; B rows per step.

- E[N](α,k) = (1 - α^(k+1)) / (1 - α) tokens emitted per verification (k+1 at α = 1).
- S(k) = E[N] / (1 + σ + k·cost), S(0) = 1, with σ the fixed cost of a step that
  verifies drafts and cost = c' + v(B) per draft token (``step_cost``).
- A step verifying drafts pays σ on all B rows: it pays iff
  Σ net_gain_i > B·(min_gain + (1 + min_gain)·σ) (``batch_pays``); ``best_net_gain``
  bounds a row before it is planned (``step_may_pay``).
- No row may lose: a row's time per token in the step, F / E[N_i] with F = 1 + σ +
  Σ k_j·cost_j / B, stays within 1 + slack of a plain step's (``fair_ks``). A row
  without drafts (E[N] = 1) bounds F itself, so beside it the drafts are cut to the
  few the slack buys, the likeliest kept.
- Evidence of a round: successes = accepted, trials = accepted + (1 if one was
  rejected); α̂ shrinks towards a prior (``shrunk_alpha``).
"""

from __future__ import annotations

import heapq
import math

from vllm_specdec_plugin.tuning import ALPHA_MAX, MIN_GAIN


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


def best_k(alpha: float, cost_per_draft: float, k_max: int, min_gain: float = MIN_GAIN,
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


def fair_ks(rows: list[tuple[float, int, float]], batch_size: int, fixed: float,
            slack: float, credits: list[float] | None = None,
            idle_credit: float = 0.0) -> list[int]:
    """Drafts each row keeps so that no row's time per token exceeds its bound.

    rows: per planned row (α, k, cost per draft token in plain steps); batch_size: B,
    all rows of the step (B - len(rows) of them draft nothing); fixed: σ(B); credits:
    per planned row, slack it saved (``row_credit``; 0 without); idle_credit: the
    least credit of the rows that draft nothing. F = 1 + σ + Σ k_j·cost_j / B is the
    step's time in plain steps; row r may take F <= (1 + slack)·E[N_r] + credit_r.
    Kept as proposed when every row's bound holds; otherwise each row is bounded as if
    it gained nothing (E[N] = 1): F <= 1 + slack + the least credit, spent on the draft
    positions with the most expected tokens per cost (position j of a row is worth
    α^j), none when σ alone exceeds it. Cutting is exact (the target verifies a
    prefix of each proposal)."""
    ks = [k for _, k, _ in rows]
    if not rows or sum(ks) == 0:
        return ks
    credits = credits if credits is not None else [0.0] * len(rows)
    idle = len(rows) < batch_size
    step = 1.0 + fixed + sum(k * c for _, k, c in rows) / batch_size
    if (not idle or step <= 1.0 + slack + idle_credit) and all(
            step <= (1.0 + slack) * expected_tokens(a, k) + cr
            for (a, k, _), cr in zip(rows, credits)):
        return ks
    least = min(credits + [idle_credit] if idle else credits)
    return best_positions(rows, (slack + least - fixed) * batch_size)  # Σ k_j·cost_j allowed


def best_positions(rows: list[tuple[float, int, float]], budget: float) -> list[int]:
    """Drafts each row keeps within ``budget``, the sum of the kept positions' costs.

    rows: (α, k, cost of one position). Position j of a row is worth α^j expected
    tokens; positions are taken greedily by worth per cost (ties: earlier rows), each
    row's in order, so every row keeps a prefix; a position that does not fit is
    skipped and cheaper rows may still take theirs."""
    kept = [0] * len(rows)
    heap = [(-a / max(c, 1e-12), i, a, 1) for i, (a, k, c) in enumerate(rows) if k > 0]
    heapq.heapify(heap)
    while heap:
        _, i, a, j = heapq.heappop(heap)
        cost = rows[i][2]
        if cost > budget:
            continue
        budget -= cost
        kept[i] = j
        if j < rows[i][1]:
            heapq.heappush(heap, (-(a ** (j + 1)) / max(cost, 1e-12), i, a, j + 1))
    return kept
