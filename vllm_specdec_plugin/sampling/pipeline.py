"""The request sampling pipeline: raw logits -> the distribution a request samples from.

The same function produces the target distribution p (from the target model's
verification logits) and the draft distribution q (from the draft model's logits), so
both go through identical transforms. Lossless speculative decoding needs the output
to be distributed as the *processed* p, i.e. what vLLM's own `Sampler` would sample
from for this request; q only has to be the distribution the draft token was actually
drawn from.

Order of operations (mirrors vLLM 0.32 `v1/sample/sampler.py`, `Sampler.forward` ->
`apply_logits_processors` -> `sample`):

1. logits -> float32 (`Sampler.forward`).
2. logit_bias, a non-argmax-invariant logits processor
   (`v1/sample/logits_processor/builtin.py`, `LogitBiasLogitsProcessor.apply`).
3. penalties: we call vLLM's own `model_executor/layers/utils.py` `apply_penalties`
   (what `v1/sample/ops/penalties.py` `apply_all_penalties` calls), so p on a
   speculative step is bit-identical to a plain step's on every platform (on CUDA
   the repetition penalty is a custom kernel, `_custom_ops.apply_repetition_penalties`):
   a) repetition: tokens seen in prompt OR output; positive logits are divided by the
      penalty, the others multiplied;
   b) frequency: `logits -= frequency_penalty * count_in_output`;
   c) presence: `logits -= presence_penalty * (count_in_output > 0)`.
   Frequency and presence look at output tokens only, never the prompt.
4. greedy rows (temperature < 1e-5, vLLM's `_SAMPLING_EPS`) stop here: argmax of the
   biased, penalised logits (`Sampler.sample` -> `greedy_sample`). We return its
   one-hot. Ties go to the lowest token id (`torch.argmax`).
5. temperature: `logits / temperature` (`Sampler.apply_temperature`).
6. min_p, an argmax-invariant processor (`MinPLogitsProcessor.apply`): softmax of the
   temperature-scaled logits, drop tokens with prob < min_p * max_prob.
7. top-k then top-p (`v1/sample/ops/topk_topp_sampler.py`,
   `apply_top_k_top_p_pytorch` / `apply_top_k_only`):
   top-k keeps every token whose logit is >= the k-th largest logit, so ties at the
   boundary are all kept (may keep more than k); top-p sorts the (top-k-masked) logits
   ascending, masks positions whose ascending cumulative probability is
   <= 1 - top_p, and always keeps the largest. Exact ties at the top-p boundary
   follow `torch.sort`'s order; we make vLLM's exact call (see `_apply_top_k_top_p`).
8. softmax in float32 (`TopKTopPSampler.forward_native`).

Histories. A row's *prompt* history feeds only the repetition penalty; its *output*
history (tokens generated so far) feeds all three penalties. Token ids outside
[0, V) in a history (e.g. placeholder -1) are ignored, as vLLM does with its
`-1 -> vocab_size` padding. In speculation, the distribution at draft position j
(0-based) is conditioned on the drafts d_0..d_{j-1}, so its output history is
`output + drafts[:j]` (vLLM `RejectionSampler._combine_outputs_with_spec_tokens`;
the bonus position gets all drafts, `Sampler._combine_outputs_with_spec_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

# vLLM's `_SAMPLING_EPS` (`sampling_params.py`, `v1/sample/sampler.py`): temperatures
# below it are greedy.
SAMPLING_EPS = 1e-5

# A history is either one list of token ids per row, or a [B, L] integer tensor in
# which every entry outside [0, V) is padding.
Histories = Sequence[Sequence[int]] | torch.Tensor


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """One request's sampling parameters, in the units vLLM uses."""

    temperature: float = 1.0
    """Softmax temperature; values below 1e-5 (vLLM's `_SAMPLING_EPS`) mean greedy."""
    top_k: int = 0
    """Keep the k highest logits (ties at the boundary all kept); <= 0 or >= V is off."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1.0 is off."""
    min_p: float = 0.0
    """Drop tokens with prob < min_p * max prob (after temperature); 0 is off."""
    repetition_penalty: float = 1.0
    """> 0; tokens seen in prompt or output: positive logits / penalty, others * penalty."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token present in the output history."""
    frequency_penalty: float = 0.0
    """Subtracted per occurrence of the token in the output history."""
    logit_bias: tuple[tuple[int, float], ...] | None = None
    """(token id, bias) pairs added to the raw logits before penalties; ids unique."""
    seed: int | None = None
    """Per-request seed; the caller builds `torch.Generator().manual_seed(seed)`."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}"
            )
        if self.logit_bias is not None:
            ids = [tok for tok, _ in self.logit_bias]
            if len(set(ids)) != len(ids):
                raise ValueError(f"logit_bias has duplicate token ids: {ids}")

    @property
    def is_greedy(self) -> bool:
        """True when the request takes the argmax (vLLM `SamplingType.GREEDY`)."""
        return self.temperature < SAMPLING_EPS

    @property
    def takes_raw_argmax(self) -> bool:
        """Greedy with no logit_bias and no penalties: the token is the argmax of the
        raw logits (min_p, top-k and top-p never change the argmax)."""
        return (self.is_greedy and not self.logit_bias and self.repetition_penalty == 1.0
                and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0)

    @classmethod
    def from_sampling_params(cls, sp: Any) -> SamplingSpec:
        """Build from a vLLM `SamplingParams` (duck-typed: attributes are only read)."""
        bias = getattr(sp, "logit_bias", None)
        return cls(
            temperature=float(sp.temperature),
            top_k=int(getattr(sp, "top_k", 0) or 0),
            top_p=float(getattr(sp, "top_p", 1.0)),
            min_p=float(getattr(sp, "min_p", 0.0)),
            repetition_penalty=float(getattr(sp, "repetition_penalty", 1.0)),
            presence_penalty=float(getattr(sp, "presence_penalty", 0.0)),
            frequency_penalty=float(getattr(sp, "frequency_penalty", 0.0)),
            logit_bias=(
                tuple(sorted((int(t), float(b)) for t, b in bias.items()))
                if bias
                else None
            ),
            seed=getattr(sp, "seed", None),
        )


def make_generator(spec: SamplingSpec, device: torch.device | str = "cpu"):
    """A `torch.Generator` seeded like vLLM's runner does, or None when unseeded."""
    if spec.seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(spec.seed)
    return gen


def expand_histories(
    output_token_ids: Sequence[Sequence[int]],  # [B][L_b]
    draft_token_ids: Sequence[Sequence[int]],  # [B][k_b]
) -> list[list[list[int]]]:
    """Per-position output histories for speculation.

    Returns `[B][k_b + 1][L_b + j]`: entry `[b][j]` is `output[b] + drafts[b][:j]`,
    the history that the distribution at draft position j (j = k_b is the bonus
    position) is conditioned on. Use it for the target's p at positions 0..k_b and
    for the draft's q at positions 0..k_b - 1 alike.
    """
    if len(output_token_ids) != len(draft_token_ids):
        raise ValueError("output_token_ids and draft_token_ids differ in batch size")
    return [
        [[*out, *drafts[:j]] for j in range(len(drafts) + 1)]
        for out, drafts in zip(output_token_ids, draft_token_ids)
    ]


def target_probs(
    logits: torch.Tensor,  # [B, V] float, raw model logits
    specs: Sequence[SamplingSpec],  # [B]
    prompt_token_ids: Histories,  # [B][L_prompt] or [B, L] padded
    output_token_ids: Histories,  # [B][L_out] or [B, L] padded
) -> torch.Tensor:
    """The distribution each row samples from, as vLLM's `Sampler` would.

    Used for the target (p) and the draft (q) alike. Returns probs [B, V] float32
    (rows sum to 1; greedy rows are the one-hot of the processed argmax).
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [B, V], got {tuple(logits.shape)}")
    num_rows, vocab_size = logits.shape
    _check_batch(specs, num_rows)
    device = logits.device
    return _probs(logits, specs, _pad_histories(prompt_token_ids, num_rows, vocab_size, device),
                  _pad_histories(output_token_ids, num_rows, vocab_size, device))


def position_probs(
    logits: torch.Tensor,  # [B, P, V] float, raw logits at P consecutive positions
    specs: Sequence[SamplingSpec],  # [B]
    prompt_token_ids: Histories,  # [B][L_prompt] or [B, L] padded
    output_token_ids: Histories,  # [B][L_out] or [B, L] padded
    draft_token_ids: Sequence[Sequence[int]] | torch.Tensor,  # [B][k_b] or [B, K]
) -> torch.Tensor:
    """`target_probs` at every speculative position, drafts entering the history.

    Position j of row b uses output history `output[b] + drafts[b][:j]` (see
    `expand_histories`); positions past k_b reuse all k_b drafts (those rows are
    placeholders for the rejection sampler and never read). A tensor
    `draft_token_ids` is placeholder-padded: ids outside [0, V) are ignored.
    For the target pass P = K + 1; for the draft pass P = K. Returns [B, P, V]
    float32.
    """
    if logits.ndim != 3:
        raise ValueError(f"logits must be [B, P, V], got {tuple(logits.shape)}")
    num_rows, num_pos, vocab_size = logits.shape
    _check_batch(specs, num_rows)
    device = logits.device
    prompt = _pad_histories(prompt_token_ids, num_rows, vocab_size, device)   # [B, Lp]
    output = _pad_histories(output_token_ids, num_rows, vocab_size, device)   # [B, Lo]

    # Position j's output history: output + drafts[:j], the rest padding. [B, P, Lo + K']
    drafts = _pad_histories(draft_token_ids, num_rows, vocab_size, device)
    drafts = drafts[:, : max(num_pos - 1, 0)]                                 # [B, K']
    seen = (torch.arange(drafts.shape[1], device=device).unsqueeze(0)
            < torch.arange(num_pos, device=device).unsqueeze(1))               # [P, K']
    prefix = torch.where(seen, drafts.unsqueeze(1), vocab_size)
    history = torch.cat([output.unsqueeze(1).expand(-1, num_pos, -1), prefix], dim=2)

    flat_specs = [s for s in specs for _ in range(num_pos)]
    probs = _probs(
        logits.reshape(num_rows * num_pos, vocab_size),
        flat_specs,
        prompt.repeat_interleave(num_pos, dim=0),
        history.reshape(num_rows * num_pos, -1),
    )
    return probs.view(num_rows, num_pos, vocab_size)


# --------------------------------------------------------------------------- internals


def _check_batch(specs: Sequence[SamplingSpec], num_rows: int) -> None:
    if len(specs) != num_rows:
        raise ValueError(f"got {len(specs)} specs for {num_rows} rows")


def _pad_histories(
    histories: Histories, num_rows: int, vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[B, L] int64 with every id outside [0, V) mapped to the pad bucket V."""
    if isinstance(histories, torch.Tensor):
        if histories.ndim != 2 or histories.shape[0] != num_rows:
            raise ValueError(f"history tensor must be [{num_rows}, L]")
        tokens = histories.to(device=device, dtype=torch.long)
    else:
        if len(histories) != num_rows:
            raise ValueError(f"got {len(histories)} histories for {num_rows} rows")
        width = max((len(h) for h in histories), default=0)
        tokens = torch.full((num_rows, width), vocab_size, dtype=torch.long)
        for row, hist in enumerate(histories):
            if len(hist):
                tokens[row, : len(hist)] = torch.as_tensor(hist, dtype=torch.long)
        tokens = tokens.to(device)
    return tokens.masked_fill((tokens < 0) | (tokens >= vocab_size), vocab_size)


def _probs(
    logits: torch.Tensor,  # [N, V] float
    specs: Sequence[SamplingSpec],  # [N]
    prompt_tokens: torch.Tensor,  # [N, Lp] int64, padding = V
    output_tokens: torch.Tensor,  # [N, Lo] int64, padding = V
) -> torch.Tensor:
    num_rows, vocab_size = logits.shape
    device = logits.device
    logits = logits.to(torch.float32, copy=True)

    # 2. logit_bias (before penalties: a non-argmax-invariant processor).
    rows, toks, vals = [], [], []
    for row, spec in enumerate(specs):
        for tok, bias in spec.logit_bias or ():
            if not 0 <= tok < vocab_size:
                raise ValueError(f"logit_bias token id {tok} outside [0, {vocab_size})")
            rows.append(row)
            toks.append(tok)
            vals.append(bias)
    if rows:
        index = (
            torch.tensor(rows, dtype=torch.long, device=device),
            torch.tensor(toks, dtype=torch.long, device=device),
        )
        logits.index_put_(
            index, torch.tensor(vals, dtype=torch.float32, device=device), accumulate=True
        )

    # 3. penalties, by vLLM's own op. Like vLLM's Sampler we skip it when no row has
    # one; a no-op penalty on a row is bit-identical to none (x * 1.0, x - 0.0).
    rep = _row_tensor(specs, "repetition_penalty", device)
    freq = _row_tensor(specs, "frequency_penalty", device)
    pres = _row_tensor(specs, "presence_penalty", device)
    if bool((rep != 1.0).any() | (freq != 0.0).any() | (pres != 0.0).any()):
        from vllm_specdec_plugin.compat.penalties import apply_penalties

        apply_penalties(logits, prompt_tokens, output_tokens, pres, freq, rep)

    greedy = torch.tensor([s.is_greedy for s in specs], dtype=torch.bool, device=device)
    probs = torch.empty_like(logits)
    if bool(greedy.any()):
        # 4. greedy: argmax of the biased, penalised logits.
        argmax = logits[greedy].argmax(dim=-1)
        probs[greedy] = torch.nn.functional.one_hot(argmax, vocab_size).to(torch.float32)
    random = ~greedy
    if not bool(random.any()):
        return probs
    r_specs = [s for s in specs if not s.is_greedy]
    r_logits = logits[random]

    # 5. temperature.
    r_logits = r_logits / _row_tensor(r_specs, "temperature", device).unsqueeze(1)

    # 6. min_p on the temperature-scaled distribution.
    min_p = _row_tensor(r_specs, "min_p", device)
    if bool((min_p > 0).any()):
        p = torch.softmax(r_logits, dim=-1)
        threshold = p.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
        r_logits = r_logits.masked_fill(p < threshold, float("-inf"))

    # 7. top-k, then top-p on what top-k left.
    top_k = torch.tensor(
        [s.top_k if 0 < s.top_k < vocab_size else vocab_size for s in r_specs],
        dtype=torch.long,
        device=device,
    )
    top_p = _row_tensor(r_specs, "top_p", device)
    r_logits = _apply_top_k_top_p(
        r_logits,
        top_k if bool((top_k < vocab_size).any()) else None,
        top_p if bool((top_p < 1.0).any()) else None,
    )

    # 8. softmax.
    probs[random] = torch.softmax(r_logits, dim=-1, dtype=torch.float32)
    return probs


def _row_tensor(specs: Sequence[SamplingSpec], name: str, device) -> torch.Tensor:
    return torch.tensor(
        [getattr(s, name) for s in specs], dtype=torch.float32, device=device
    )


def _apply_top_k_top_p(
    logits: torch.Tensor,  # [N, V] float32
    top_k: torch.Tensor | None,  # [N] int64 in 1..V (V is off), or None
    top_p: torch.Tensor | None,  # [N] float32 in (0, 1] (1 is off), or None
) -> torch.Tensor:
    """Copy of vLLM's `apply_top_k_top_p_pytorch` (`v1/sample/ops/topk_topp_sampler.py`).

    top-k masks logits below the k-th largest, so ties at the boundary are all kept.
    top-p sorts ascending and masks positions whose cumulative probability is
    <= 1 - top_p, always keeping the last. Among exactly equal logits at the top-p
    boundary the choice follows `torch.sort`'s (unstable) order, so we make the very
    same call as vLLM to get the same answer on the same device. vLLM's Triton
    kernel (GPU default) is a different algorithm and may break such ties, and top-k
    ties, differently: that is unspecified upstream.
    """
    if top_p is None:
        if top_k is None:
            return logits
        # `apply_top_k_only`: no full sort needed.
        no_top_k = top_k == logits.shape[1]
        k = top_k.masked_fill(no_top_k, 1)
        kth = logits.topk(int(k.max()), dim=1).values.gather(1, (k - 1).unsqueeze(1))
        kth = kth.masked_fill(no_top_k.unsqueeze(1), float("-inf"))
        return logits.masked_fill(logits < kth, float("-inf"))

    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        kth = logits_sort.gather(1, (logits_sort.size(1) - top_k).unsqueeze(1))
        logits_sort = logits_sort.masked_fill(logits_sort < kth, float("-inf"))
    probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
    mask = probs_sum <= 1 - top_p.unsqueeze(1)
    mask[:, -1] = False  # keep at least one token
    logits_sort = logits_sort.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(dim=-1, index=logits_idx, src=logits_sort)
