"""Rejection sampling for speculative decoding, as pure tensor functions.

Vocabulary (these meanings throughout the package):

- draft: a token the draft proposed, drawn from the draft distribution q (after the
  request's sampling pipeline);
- target: the distribution p of the target's verification pass at that position
  (after the same pipeline), conditioned on the drafts before it;
- accepted: a kept draft; draft x at position j is accepted with probability
  min(1, p_j(x) / q_j(x)), left to right, stopping at the first rejection;
- recovered: the token sampled from norm(max(0, p_j - q_j)) at the first rejected
  position j, in place of the rejected draft;
- bonus: the token sampled from p at position k when all k drafts are accepted;
- placeholder: PLACEHOLDER_TOKEN_ID = -1, padding after a row's output.

Layout (vLLM's flat one): request b with n_b drafts owns n_b + 1 consecutive rows of p
(its draft positions, then the bonus position; T = sum(n_b + 1)) and n_b consecutive
rows of q. Nothing is padded to the batch's largest k: per-request work reads [B, K]
scalars and one [B, V] final row.

Every row outputs its accepted drafts and exactly one recovered or bonus token, 1..k+1
tokens, each distributed exactly as sampling from p one token at a time (Leviathan et
al., 2023, https://arxiv.org/abs/2211.17192; vLLM's `v1/sample/rejection_sampler.py`).
Greedy rows draw nothing: a draft is accepted while it equals argmax(p_j); the
recovered token is argmax(p_j) at the first mismatch, the bonus argmax(p_k).

Seeded sampled rows (a seed, not greedy) are verified like greedy rows, against y_j, the
token the request's own noise samples from p_j (the caller draws it: `compat/seeded.py`;
on CPU vLLM's own op and seed stream, so the text is vLLM's without speculation). The
token emitted at a position is then y of that position whatever was drafted (Daliri,
Musco & Suresh, https://arxiv.org/abs/2408.07978); q is not read for these rows. The
draft drafts with the same noise on q: accepted when it picks the same token under both.

Random numbers: greedy and seeded rows draw none here. Unseeded sampled rows share torch's
default generator: one `torch.rand(B, K + 1, dtype=torch.float64)` per batch that has
any; row b's u_j (j < n) tests draft j (accepted iff u_j <= p_j(x) / q_j(x)) and u_n
inverts the float64 cumulative sum of its recovered or bonus distribution. The tests'
reference (`specdec_testing/rejection_reference.py`) draws the same, so it matches
`rejection_sample` bit for bit from the same generator state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vllm_specdec_plugin.token_draw import first_argmax, sample_from_weights

PLACEHOLDER_TOKEN_ID = -1


@dataclass(frozen=True)
class TargetRows:
    """p computed on first use: a verification reads position j of a request only when
    its drafts before j were accepted, so the sampling pipeline (for sampled rows the
    top-p sort over V, about 4.5 ms a position at V = 49,152 on one CPU thread) runs
    only on the positions that can be reached.

    shape: (T, V); rows: flat p-row indices [n] int64 -> their p rows [n, V] float32
    (greedy rows: any logits with p's argmax); seeded: (indices [n], their p rows)
    -> y [n] int64, the tokens the requests' own noise samples there (rows of seeded
    sampled requests only; None without such rows)."""

    shape: tuple[int, int]
    device: torch.device
    rows: Callable[[torch.Tensor], torch.Tensor]
    seeded: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    ndim: int = 2


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [B, K] int64, placeholder-padded past num_draft
    num_draft_tokens: torch.Tensor,  # [B] int64 in 0..K
    draft_probs: torch.Tensor | None,  # [sum(n_b), V] float, or None (point mass)
    target_probs: torch.Tensor | TargetRows,  # [sum(n_b + 1), V] float, or made on use
    is_greedy: torch.Tensor,  # [B] bool
    seeded: Sequence[bool] | None = None,  # [B]: sampled rows with a seed
    seeded_tokens: torch.Tensor | None = None,  # [T] int64: y_j on those rows' p rows
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched rejection sampling (the module docstring: rule, layout, draws).

    draft_probs None, or an all-zero q row: q_j is the draft's one-hot. A draft outside
    [0, V) is always rejected and replaced from p. Greedy rows read only argmax(p_j), so
    their p rows may be any logits with that argmax. Seeded sampled rows (``seeded[b]``)
    are verified against ``seeded_tokens`` (required for them with a tensor p; a
    ``TargetRows`` brings its own): the token their own noise samples at each position.
    Position j is read only for rows that accepted every draft before it, position by
    position (``TargetRows``). Returns (output_token_ids [B, K + 1] int64: accepted
    drafts, one recovered or bonus token, then placeholders; num_accepted [B] int64).
    """
    batch, max_k, vocab, device = check_shapes(
        draft_token_ids, num_draft_tokens, draft_probs, target_probs, is_greedy
    )
    coupled = list(seeded) if seeded is not None else [False] * batch  # [B]
    if len(coupled) != batch:
        raise ValueError(f"got {len(coupled)} seeded flags for {batch} rows")
    if isinstance(target_probs, torch.Tensor):
        if any(coupled) and (seeded_tokens is None
                             or tuple(seeded_tokens.shape) != (target_probs.shape[0],)):
            raise ValueError("seeded sampled rows need seeded_tokens [T] (one per p row)")
        full = target_probs.to(torch.float32)
        ys = None if seeded_tokens is None else seeded_tokens.to(device)
        target = TargetRows(tuple(full.shape), device, lambda idx: full[idx],
                            None if ys is None else (lambda idx, _rows: ys[idx]))
    else:
        target = target_probs
        if any(coupled) and target.seeded is None:
            raise ValueError("seeded sampled rows need a TargetRows with seeded")
    num_draft = num_draft_tokens.to(device=device, dtype=torch.long)  # [B]
    greedy = is_greedy.to(device=device, dtype=torch.bool)  # [B]
    drafts = draft_token_ids.to(device=device, dtype=torch.long)  # [B, K]
    rows = torch.arange(batch, device=device)
    cols = torch.arange(max_k, device=device)
    in_draft = cols.unsqueeze(0) < num_draft.unsqueeze(1)  # [B, K]
    in_vocab = (drafts >= 0) & (drafts < vocab)  # [B, K]
    safe_drafts = torch.where(in_vocab, drafts, 0)  # [B, K]
    p_row, q_row = _row_maps(num_draft, max_k)  # [B, K+1], [B, K] row indices

    # Seeded sampled rows verify exactly like greedy ones, against y_j (module doc).
    seeded_b = torch.tensor(coupled, dtype=torch.bool, device=device)  # [B]
    fixed = greedy | seeded_b  # [B]
    if bool(fixed.all()):
        uniforms = torch.zeros(batch, max_k + 1, dtype=torch.float64, device=device)
    else:  # one batched draw for the unseeded sampled rows (others ignore theirs)
        uniforms = torch.rand(batch, max_k + 1, dtype=torch.float64, device=device)

    # q at each draft; only a row with q(x) == 0 can be an all-zero (point-mass) q row,
    # so only those rows are scanned over V.
    q = None if draft_probs is None or draft_probs.shape[0] == 0 else draft_probs.to(torch.float32)
    if q is None:
        point_mass = torch.ones(batch, max_k, dtype=torch.bool, device=device)
        q_draft = torch.ones(batch, max_k, dtype=torch.float32, device=device)
    else:
        q_draft = q[q_row, safe_drafts]  # [B, K]
        maybe = (q_draft == 0) & in_draft
        point_mass = torch.zeros_like(maybe)
        if bool(maybe.any()):
            point_mass[maybe] = ~(q[q_row[maybe]] > 0).any(dim=-1)
        q_draft = torch.where(point_mass, 1.0, q_draft)

    p = _Reached(target, greedy, seeded_b, num_draft)
    # Left to right over the rows still accepting: draft j against p_j, accepted with
    # probability min(1, p/q) (compared in float64 like vLLM's kernel; q == 0 rejects),
    # or equal to argmax(p_j) / y_j on fixed rows.
    num_accepted = torch.zeros(batch, dtype=torch.long, device=device)  # [B]
    testing = in_draft[:, 0] if max_k else torch.zeros(batch, dtype=torch.bool, device=device)
    for j in range(max_k):
        b = testing.nonzero().squeeze(1)
        if b.numel() == 0:
            break
        idx = p_row[b, j]
        p.fetch(idx)
        fixed_ok = drafts[b, j] == p.fixed[idx]
        sampled_ok = (q_draft[b, j] > 0) & (
            p.probs[idx, safe_drafts[b, j]].double() / q_draft[b, j].double() >= uniforms[b, j]
        )
        ok = torch.where(fixed[b], fixed_ok, sampled_ok) & in_vocab[b, j]
        num_accepted[b] += ok.long()
        testing = torch.zeros_like(testing)
        if j + 1 < max_k:
            testing[b] = ok & in_draft[b, j + 1]
    all_accepted = num_accepted == num_draft  # [B]
    final_pos = num_accepted  # [B], position of the recovered or bonus token

    # One recovered or bonus token per row.
    final_idx = p_row[rows, final_pos]  # [B]
    p.fetch(final_idx)
    p_final = p.probs[final_idx]  # [B, V]
    dist = p_final
    if max_k > 0:
        q_pos = final_pos.clamp(max=max_k - 1)
        rejected_draft = safe_drafts[rows, q_pos].unsqueeze(1)  # [B, 1]
        valid = in_vocab[rows, q_pos].unsqueeze(1)  # [B, 1]
        # q at the final position; a point-mass row is all zeros plus a 1 at the draft.
        # (A row with no drafts reads some other row's q here; valid zeroes it.)
        q_final = torch.zeros_like(p_final) if q is None else q[q_row[rows, q_pos]]  # copy
        one_at_draft = (point_mass[rows, q_pos].unsqueeze(1) & valid).float()  # [B, 1]
        q_final.scatter_add_(1, rejected_draft, one_at_draft)
        # An invalid draft was rejected with probability 1, so its replacement is ~ p.
        q_final *= valid
        residual = (p_final - q_final).clamp_min(0.0)  # [B, V]
        dist = torch.where(all_accepted.unsqueeze(1), p_final, residual)
    # An all-zero residual means p_j == q_j up to float error: for p and q that each
    # sum to 1, sum(max(0, p - q)) = TV(p, q), which is 0 only when p == q, and then
    # every draft is accepted (p/q = 1 >= u). Only a float-rounding rejection (or a
    # draft outside q's support) lands here; sampling from p is then as right as
    # anything, to within float error.
    dist = torch.where((dist > 0).any(dim=-1, keepdim=True), dist, p_final)
    final_uniform = uniforms.gather(1, num_draft.unsqueeze(1)).squeeze(1)  # u_n
    sampled_token = sample_from_weights(dist, final_uniform)  # [B]
    final_token = torch.where(fixed, p.fixed[final_idx], sampled_token)

    output = torch.full(
        (batch, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=device
    )
    keep = cols.unsqueeze(0) < num_accepted.unsqueeze(1)  # [B, K]
    output[:, :max_k] = torch.where(keep, drafts, PLACEHOLDER_TOKEN_ID)
    output.scatter_(1, final_pos.unsqueeze(1), final_token.unsqueeze(1))
    return output, num_accepted


def greedy_verify(
    draft_token_ids: torch.Tensor,  # [B, K] int64, placeholder-padded past num_draft
    num_draft_tokens: torch.Tensor,  # [B] int64 in 0..K
    target_argmax: torch.Tensor,  # [B, K + 1] int64: argmax of p_j (ties: lowest id)
) -> torch.Tensor:
    """Output token ids [B, K + 1] int64 of an all-greedy batch from the argmaxes alone:
    ``rejection_sample``'s result when p_j is the one-hot of ``target_argmax[:, j]``,
    without building p (for greedy rows no processor changes, all it needs)."""
    batch, max_k = draft_token_ids.shape
    device = target_argmax.device
    drafts = draft_token_ids.to(device=device, dtype=torch.long)
    positions = torch.arange(max_k, device=device)
    in_draft = positions.unsqueeze(0) < num_draft_tokens.to(device).unsqueeze(1)  # [B, K]
    accept = (drafts == target_argmax[:, :max_k]) & in_draft
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [B]
    output = torch.full((batch, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.long,
                        device=device)
    keep = positions.unsqueeze(0) < num_accepted.unsqueeze(1)
    output[:, :max_k] = torch.where(keep, drafts, PLACEHOLDER_TOKEN_ID)
    final = target_argmax.gather(1, num_accepted.unsqueeze(1))  # [B, 1]
    output.scatter_(1, num_accepted.unsqueeze(1), final)
    return output


# ---------------------------- input checks (shared with the tests' rejection reference)


def check_shapes(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    is_greedy: torch.Tensor,
) -> tuple[int, int, int, torch.device]:
    if draft_token_ids.ndim != 2:
        raise ValueError(f"draft_token_ids must be [B, K], got {tuple(draft_token_ids.shape)}")
    batch, max_k = draft_token_ids.shape
    if tuple(num_draft_tokens.shape) != (batch,) or tuple(is_greedy.shape) != (batch,):
        raise ValueError("num_draft_tokens and is_greedy must be [B]")
    if batch and (int(num_draft_tokens.min()) < 0 or int(num_draft_tokens.max()) > max_k):
        raise ValueError(f"num_draft_tokens must lie in 0..{max_k}")
    total = int(num_draft_tokens.sum())
    if target_probs.ndim != 2 or target_probs.shape[0] != total + batch:
        raise ValueError(
            f"target_probs must be [{total + batch}, V], got {tuple(target_probs.shape)}"
        )
    vocab = target_probs.shape[1]
    if draft_probs is not None and tuple(draft_probs.shape) != (total, vocab):
        raise ValueError(
            f"draft_probs must be [{total}, {vocab}], got {tuple(draft_probs.shape)}"
        )
    return batch, max_k, vocab, target_probs.device


# --------------------------------------------------------------------------- internals


def _row_maps(num_draft: torch.Tensor, max_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices into the flat p [B, K+1] and q [B, K] (int64): position j of request
    b is row min(j, n_b) of p and min(j, n_b - 1) of q, clamped into [0, sum(n_b) - 1]
    (positions past n_b point at some row whose value is never used)."""
    counts = num_draft + 1
    p_start = counts.cumsum(0) - counts  # [B]
    q_start = num_draft.cumsum(0) - num_draft  # [B]
    pos = torch.arange(max_k + 1, device=num_draft.device).unsqueeze(0)  # [1, K+1]
    p_row = p_start.unsqueeze(1) + torch.minimum(pos, num_draft.unsqueeze(1))
    q_last = max(int(num_draft.sum()) - 1, 0)
    q_row = (q_start.unsqueeze(1) + pos[:, :max_k]).clamp(max=q_last)
    return p_row, q_row


class _Reached:
    """The p rows read so far ([T, V] float32, filled on first use) and each one's fixed
    token ([T] int64): argmax(p) on greedy requests' rows (ties: lowest id), y on
    seeded sampled ones', 0 elsewhere (never read)."""

    def __init__(self, target: TargetRows, greedy: torch.Tensor, seeded: torch.Tensor,
                 num_draft: torch.Tensor) -> None:
        total, vocab = target.shape
        device = greedy.device
        self._target = target
        self._greedy = greedy.repeat_interleave(num_draft + 1)  # [T] owner is greedy
        self._seeded = seeded.repeat_interleave(num_draft + 1)  # [T] owner is seeded
        self._have = torch.zeros(total, dtype=torch.bool, device=device)
        # not zeroed: [T, V] is 28 MB at 144 rows of V 49,152, and only fetched rows are read
        self.probs = torch.empty(total, vocab, dtype=torch.float32, device=device)
        self.fixed = torch.zeros(total, dtype=torch.long, device=device)

    def fetch(self, idx: torch.Tensor) -> None:
        """Make rows ``idx`` [n] int64 (each at most once; repeats allowed)."""
        idx = torch.unique(idx[~self._have[idx]])
        if idx.numel() == 0:
            return
        got = self._target.rows(idx).to(torch.float32)  # [n, V]
        self.probs[idx] = got
        self._have[idx] = True
        greedy = self._greedy[idx]
        if bool(greedy.any()):
            self.fixed[idx[greedy]] = first_argmax(got[greedy])
        seeded = self._seeded[idx]
        if bool(seeded.any()):
            self.fixed[idx[seeded]] = self._target.seeded(idx[seeded], got[seeded]).to(
                self.fixed.device)
