"""vLLM's side of a ``vocab_cost`` cell: the runner state and metadata the plugin's verify
path reads, and vLLM's own speculative host path on the same inputs.

On a CPU every op over the vocabulary is host time, and vLLM pays some of it in every
speculative step whichever proposer runs: its rejection sampler reads the target's
[T + B, V] logits, its draft-model proposer takes an argmax over [B, V] per draft pass.
Those grow with V for vLLM as much as for the plugin. ``InTree`` times them on the
same inputs, so the report can set the plugin's host time beside vLLM's own per V.

- verify: ``RejectionSampler(Sampler()).forward`` on the cell's target logits, drafts
  and q (the tensor vLLM's runner gathers from the plugin's channel; None where the
  drafts are point masses), with the ``SamplingMetadata`` vLLM's ``InputBatch`` builds
  for the cell's SamplingParams (temperature, top-p/top-k, penalties over prompt and
  output ids, the drafts as ``spec_token_ids``). On a CPU its kernels are the platform's
  fallbacks, as in a served engine (sampled rows then read vLLM 0.32's mis-expanded
  per-token temperatures: the cost is vLLM's, the tokens need not be right).
- draft: k argmaxes over the draft's [B, V] logits (vLLM's draft proposers draft
  greedily and hand no probabilities), or nothing for n-gram drafts.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

DEVICE = torch.device("cpu")
_GREEDY_EPS = 1e-5   # vLLM's _SAMPLING_EPS: below it a request is greedy
_overrides = False   # vLLM's CPU kernel fallbacks registered in this process


def entries() -> dict[str, tuple[str, str]]:
    """The vLLM names this module calls (``vocab_cost._entries`` imports them loudly)."""
    return {
        "RejectionSampler": ("vllm.v1.sample.rejection_sampler", "RejectionSampler"),
        "Sampler": ("vllm.v1.sample.sampler", "Sampler"),
        "SamplingMetadata": ("vllm.v1.sample.metadata", "SamplingMetadata"),
        "LogitsProcessors": ("vllm.v1.sample.logits_processor", "LogitsProcessors"),
        "current_platform": ("vllm.platforms", "current_platform"),
    }


def fake_runner(params: list[Any], prompts: list[list[int]], outputs: list[list[int]],
                q: torch.Tensor | None) -> SimpleNamespace:
    """The slice of vLLM's GPUModelRunner that the verify path reads: the persistent
    batch's req_ids and generators, per-request state, and the q channel that
    ``runner_hooks.set_draft_probs`` fills (rows in batch order). Adapt here when the
    adapter reads more of the runner."""
    req_ids = [f"req-{b}" for b in range(len(params))]
    requests = {rid: SimpleNamespace(sampling_params=sp, prompt_token_ids=p, output_token_ids=o)
                for rid, sp, p, o in zip(req_ids, params, prompts, outputs)}
    return SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=req_ids, generators={},  # unseeded rows
                                    req_id_to_index={r: i for i, r in enumerate(req_ids)}),
        requests=requests, _draft_probs=q, _draft_prob_req_ids=None if q is None else req_ids)


def spec_metadata(api: SimpleNamespace, drafts: list[list[int]]) -> Any:
    """SpecDecodeMetadata with the logit row indices vLLM's runner computes
    (``_calc_spec_decode_metadata``): request b's draft rows, then its bonus row;
    ``make_dummy`` leaves them zero."""
    md = api.SpecDecodeMetadata.make_dummy(drafts, DEVICE)
    target, bonus = logit_rows(drafts)
    md.target_logits_indices = torch.tensor(target, dtype=torch.int32)
    md.bonus_logits_indices = torch.tensor(bonus, dtype=torch.int32)
    md.logits_indices = torch.arange(len(target) + len(bonus), dtype=torch.int32)
    return md


def logit_rows(drafts: list[list[int]]) -> tuple[list[int], list[int]]:
    """(target rows, bonus rows) of the flat verify logits: request b's draft rows,
    then its bonus row, as vLLM's runner lays them out."""
    target, bonus, start = [], [], 0
    for d in drafts:
        target += range(start, start + len(d))
        bonus.append(start + len(d))
        start += len(d) + 1
    return target, bonus


def sampling_metadata(api: SimpleNamespace, params: list[Any], prompts: list[list[int]],
                      outputs: list[list[int]], drafts: list[list[int]], vocab: int) -> Any:
    """SamplingMetadata as ``InputBatch._make_sampling_metadata`` fills it for these rows
    (prompt ids padded with ``vocab``, as vLLM pads them)."""
    greedy = [sp.temperature < _GREEDY_EPS for sp in params]
    no_penalties = all(sp.repetition_penalty == 1.0 and sp.presence_penalty == 0.0
                       and sp.frequency_penalty == 0.0 for sp in params)

    def per_row(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32)

    prompt_ids = None
    if not no_penalties:
        width = max(len(p) for p in prompts)
        prompt_ids = torch.full((len(prompts), width), vocab, dtype=torch.int64)
        for i, p in enumerate(prompts):
            prompt_ids[i, :len(p)] = torch.tensor(p)
    top_p = [sp.top_p for sp in params]
    top_k = [sp.top_k if sp.top_k > 0 else vocab for sp in params]
    return api.SamplingMetadata(
        temperature=None if all(greedy) else per_row([0.0 if g else sp.temperature
                                                      for g, sp in zip(greedy, params)]),
        all_greedy=all(greedy), all_random=not any(greedy),
        top_p=None if all(p >= 1.0 for p in top_p) else per_row(top_p),
        top_k=None if all(k >= vocab for k in top_k) else torch.tensor(top_k, dtype=torch.int32),
        generators={}, max_num_logprobs=None, no_penalties=no_penalties,
        prompt_token_ids=prompt_ids,
        frequency_penalties=per_row([sp.frequency_penalty for sp in params]),
        presence_penalties=per_row([sp.presence_penalty for sp in params]),
        repetition_penalties=per_row([sp.repetition_penalty for sp in params]),
        output_token_ids=[] if no_penalties else [list(o) for o in outputs],
        allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=api.LogitsProcessors(), spec_token_ids=[list(d) for d in drafts])


class InTree:
    """vLLM's host path for one cell; inputs fixed at construction, outside the timers."""

    def __init__(self, api: SimpleNamespace, cell: Any, params: list[Any],
                 drafts: list[list[int]], q_rows: torch.Tensor | None):
        global _overrides
        if not _overrides:   # as vLLM's worker does once at start-up (worker_base): on a
            # CPU without Triton the rejection sampler's kernels are vLLM's fallbacks
            api.current_platform.register_triton_kernel_overrides()
            _overrides = True
        self.sampler = api.RejectionSampler(api.Sampler())
        self.metadata = cell.metadata
        self.q_rows = q_rows
        self.logits = cell.target_logits
        self.draft_logits = None if cell.mix.ngram else cell.draft_logits
        self.sampling = sampling_metadata(api, params, cell.prompts, cell.outputs, drafts,
                                          cell.vocab)

    def verify(self) -> torch.Tensor:
        # forward indexes the logits into new tensors before its in-place steps (0.32), so
        # the same logits serve every repeat, as they do for the plugin's side
        out = self.sampler(self.metadata, self.q_rows, self.logits, self.sampling)
        return out.sampled_token_ids

    def draft(self) -> None:
        if self.draft_logits is not None:   # k passes, then the round's one host copy
            torch.stack([self.draft_logits[pos].argmax(dim=-1)
                         for pos in range(self.draft_logits.shape[0])], dim=1).tolist()
