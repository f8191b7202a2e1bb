"""The request sampling pipeline: raw logits -> the distribution a request samples from.

One function makes the target's p (verification logits) and the draft's q, so both go
through identical transforms. The output must be distributed as the *processed* p, what
vLLM's own `Sampler` samples from. vLLM 0.32's order (`v1/sample/sampler.py`):

1. logits -> float32;
2. logit_bias (`LogitBiasLogitsProcessor.apply`);
3. penalties by vLLM's own `apply_penalties` (`model_executor/layers/utils.py`; a CUDA
   kernel on GPU), so p is bit-identical to a plain step's: repetition over prompt and
   output (positive logits divided, others multiplied), frequency and presence over
   the output only;
4. greedy rows (temperature < 1e-5) stop here: argmax, ties to the lowest id
   (`target_probs` returns its one-hot, `position_probs` the logits themselves);
5. temperature; 6. min_p (drop prob < min_p * max prob, `MinPLogitsProcessor`);
7. top-k then top-p by vLLM's own `apply_top_k_top_p` (`compat/top_k_top_p.py`), so
   ties at either boundary fall as vLLM's op decides;
8. softmax in float32 (`TopKTopPSampler.forward_native`).

Histories (what the penalties read, and how drafts enter them): `histories.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vllm_specdec_plugin.sampling.histories import (Histories, check_histories,
                                                   history_rows, pad_histories)
from vllm_specdec_plugin.token_draw import first_argmax

# vLLM's `_SAMPLING_EPS` (`sampling_params.py`, `v1/sample/sampler.py`): temperatures
# below it are greedy.
SAMPLING_EPS = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """One request's sampling parameters, in the units vLLM uses."""

    temperature: float = 1.0        # below SAMPLING_EPS: greedy
    top_k: int = 0                  # keep the k highest logits (boundary ties kept); <= 0 or >= V: off
    top_p: float = 1.0              # nucleus mass in (0, 1]; 1.0: off
    min_p: float = 0.0              # drop prob < min_p * max prob (after temperature); 0: off
    repetition_penalty: float = 1.0  # > 0; seen in prompt or output: logit > 0 / it, else * it
    presence_penalty: float = 0.0   # subtracted once per token present in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    logit_bias: tuple[tuple[int, float], ...] | None = None  # (token id, bias), ids unique
    seed: int | None = None         # per-request seed (``make_generator``)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.logit_bias is not None:
            ids = [tok for tok, _ in self.logit_bias]
            if len(set(ids)) != len(ids):
                raise ValueError(f"logit_bias has duplicate token ids: {ids}")

    @property
    def is_greedy(self) -> bool:  # vLLM's SamplingType.GREEDY
        return self.temperature < SAMPLING_EPS

    @property
    def has_penalties(self) -> bool:  # (the histories are read)
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def takes_raw_argmax(self) -> bool:
        """Greedy without logit_bias or penalties: the raw logits' argmax (min_p, top-k and
        top-p never change it)."""
        return self.is_greedy and not self.logit_bias and not self.has_penalties

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
            logit_bias=tuple(sorted((int(t), float(b)) for t, b in bias.items())) if bias else None,
            seed=getattr(sp, "seed", None),
        )


def make_generator(spec: SamplingSpec, device: torch.device | str = "cpu"):
    """A `torch.Generator` seeded like vLLM's runner does, or None when unseeded."""
    if spec.seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(spec.seed)
    return gen


def target_probs(
    logits: torch.Tensor,  # [B, V] float, raw model logits
    specs: Sequence[SamplingSpec],  # [B]
    prompt_token_ids: Histories,  # [B][L_prompt] or [B, L] padded
    output_token_ids: Histories,  # [B][L_out] or [B, L] padded
    keep_logits: Sequence[bool] | None = None,  # [B]: sampled rows returned as logits
) -> torch.Tensor:
    """The distribution each row samples from, as vLLM's `Sampler` would, for p and q
    alike: probs [B, V] float32 (greedy rows: the one-hot of the processed argmax;
    ``keep_logits`` sampled rows: the processed logits, before the softmax).
    Histories are read only for rows with a penalty; others may be empty."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be [B, V], got {tuple(logits.shape)}")
    _check_batch(specs, logits.shape[0])
    check_histories(prompt_token_ids, logits.shape[0])
    check_histories(output_token_ids, logits.shape[0])
    return _probs(logits, specs, lambda r: history_rows(prompt_token_ids, r),
                  lambda r: history_rows(output_token_ids, r), one_hot_greedy=True,
                  keep_logits=keep_logits)


def position_probs(
    logits: torch.Tensor,  # [T, V] float: per request its k_b + 1 positions, in order
    specs: Sequence[SamplingSpec],  # [B]
    prompt_token_ids: Sequence[Sequence[int]],  # [B][L_prompt]
    output_token_ids: Sequence[Sequence[int]],  # [B][L_out]
    draft_token_ids: Sequence[Sequence[int]],  # [B][k_b]
    keep_logits: Sequence[bool] | None = None,  # [B]: sampled requests returned as logits
    rows: Sequence[int] | None = None,  # flat rows to make (None: all T)
) -> torch.Tensor:
    """`target_probs` at every speculative position, in vLLM's flat layout: request b
    owns k_b + 1 consecutive rows, its positions 0..k_b, position j's output history
    `output[b] + drafts[b][:j]`. Returns [T, V] float32 (``rows``: [len(rows), V], those
    rows only): probs for sampled rows, the processed logits for greedy rows (the
    rejection step reads only their argmax) and for ``keep_logits`` requests (seeded
    rows: vLLM's sampling op takes logits)."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be [T, V], got {tuple(logits.shape)}")
    _check_batch(specs, len(draft_token_ids))
    counts = [len(d) + 1 for d in draft_token_ids]
    if sum(counts) != logits.shape[0]:
        raise ValueError(f"logits has {logits.shape[0]} rows, drafts need {sum(counts)}")
    flat_specs = [s for s, n in zip(specs, counts) for _ in range(n)]
    owner = [b for b, n in enumerate(counts) for _ in range(n)]           # [T] request
    pos = [j for n in counts for j in range(n)]                           # [T] position

    def prompts(rows: list[int]) -> list[Sequence[int]]:
        return [prompt_token_ids[owner[r]] for r in rows]

    def histories(rows: list[int]) -> list[list[int]]:
        return [[*output_token_ids[owner[r]], *draft_token_ids[owner[r]][: pos[r]]]
                for r in rows]

    flat_keep = None if keep_logits is None else [keep_logits[b] for b in owner]
    if rows is not None:  # the subset: each row's spec, owner and position go with it
        rows = list(rows)
        logits = _select(logits, rows)
        flat_specs = [flat_specs[r] for r in rows]
        owner, pos = [owner[r] for r in rows], [pos[r] for r in rows]
        flat_keep = None if flat_keep is None else [flat_keep[r] for r in rows]
    return _probs(logits, flat_specs, prompts, histories, one_hot_greedy=False,
                  keep_logits=flat_keep)


# --------------------------------------------------------------------------- internals


def _check_batch(specs: Sequence[SamplingSpec], num_rows: int) -> None:
    if len(specs) != num_rows:
        raise ValueError(f"got {len(specs)} specs for {num_rows} rows")


def _probs(
    logits: torch.Tensor,  # [N, V] float
    specs: Sequence[SamplingSpec],  # [N]
    prompts: Callable[[list[int]], Histories],  # rows -> their prompt histories
    outputs: Callable[[list[int]], Histories],  # rows -> their output histories
    one_hot_greedy: bool,
    keep_logits: Sequence[bool] | None = None,  # [N]: sampled rows left as logits
) -> torch.Tensor:
    """[N, V] float32: probs for sampled rows (``keep_logits`` ones: the processed
    logits); greedy rows the one-hot of the processed argmax, or (one_hot_greedy False)
    the processed logits. Each step is row-independent and runs only on the rows it
    changes: bit-identical to vLLM's no-op on the others."""
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
        index = (torch.tensor(rows, dtype=torch.long, device=device),
                 torch.tensor(toks, dtype=torch.long, device=device))
        logits.index_put_(index, torch.tensor(vals, dtype=torch.float32, device=device),
                          accumulate=True)

    # 3. penalties, by vLLM's own op, on the penalised rows only: histories are
    # built for those alone (the op is per row; a no-op penalty is x * 1.0, x - 0.0).
    penalised = [r for r, s in enumerate(specs) if s.has_penalties]
    if penalised:
        from vllm_specdec_plugin.compat.penalties import apply_penalties

        pen_specs = [specs[r] for r in penalised]
        sub = _select(logits, penalised)
        apply_penalties(
            sub,
            pad_histories(prompts(penalised), len(penalised), vocab_size, device),
            pad_histories(outputs(penalised), len(penalised), vocab_size, device),
            _row_tensor(pen_specs, "presence_penalty", device),
            _row_tensor(pen_specs, "frequency_penalty", device),
            _row_tensor(pen_specs, "repetition_penalty", device),
        )
        _put(logits, penalised, sub)

    # 4. greedy rows stop here: their token is the argmax of these logits.
    random = [r for r, s in enumerate(specs) if not s.is_greedy]
    if one_hot_greedy and len(random) < num_rows:
        greedy = [r for r, s in enumerate(specs) if s.is_greedy]
        argmax = first_argmax(_select(logits, greedy))
        one_hot = torch.nn.functional.one_hot(argmax, vocab_size).to(torch.float32)
        _put(logits, greedy, one_hot)
    if not random:
        return logits
    r_specs = [specs[r] for r in random]
    r_logits = _select(logits, random)

    # 5. temperature.
    r_logits = r_logits / _row_tensor(r_specs, "temperature", device).unsqueeze(1)

    # 6. min_p on the temperature-scaled distribution (rows with min_p > 0).
    with_min_p = [i for i, s in enumerate(r_specs) if s.min_p > 0]
    if with_min_p:
        sub = _select(r_logits, with_min_p)
        p = torch.softmax(sub, dim=-1)
        threshold = p.amax(dim=-1, keepdim=True) * _row_tensor(
            [r_specs[i] for i in with_min_p], "min_p", device).unsqueeze(1)
        _put(r_logits, with_min_p, sub.masked_fill(p < threshold, float("-inf")))

    # 7. top-k, then top-p on what top-k left (rows with either set).
    cut = [i for i, s in enumerate(r_specs) if s.top_p < 1.0 or 0 < s.top_k < vocab_size]
    if cut:
        c_specs = [r_specs[i] for i in cut]
        top_k = torch.tensor([s.top_k if 0 < s.top_k < vocab_size else vocab_size for s in c_specs],
                             dtype=torch.long, device=device)
        top_p = _row_tensor(c_specs, "top_p", device)
        from vllm_specdec_plugin.compat.top_k_top_p import apply_top_k_top_p

        _put(r_logits, cut, apply_top_k_top_p(
            _select(r_logits, cut),
            top_k if bool((top_k < vocab_size).any()) else None,
            top_p if bool((top_p < 1.0).any()) else None,
        ))

    # 8. softmax (not for rows kept as logits).
    probs = torch.softmax(r_logits, dim=-1, dtype=torch.float32)
    kept = [i for i, r in enumerate(random) if keep_logits is not None and keep_logits[r]]
    if kept:
        _put(probs, kept, _select(r_logits, kept))
    if len(random) == num_rows:
        return probs
    _put(logits, random, probs)
    return logits


def _select(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """x[rows] (a copy); x itself when rows is every row in order."""
    if len(rows) == x.shape[0]:
        return x
    return x[torch.tensor(rows, dtype=torch.long, device=x.device)]


def _put(x: torch.Tensor, rows: list[int], values: torch.Tensor) -> None:
    """x[rows] = values, in place (nothing to copy when values is x)."""
    if values is x:
        return
    if len(rows) == x.shape[0]:
        x.copy_(values)
    else:
        x[torch.tensor(rows, dtype=torch.long, device=x.device)] = values


def _row_tensor(specs: Sequence[SamplingSpec], name: str, device) -> torch.Tensor:
    return torch.tensor([getattr(s, name) for s in specs], dtype=torch.float32, device=device)
