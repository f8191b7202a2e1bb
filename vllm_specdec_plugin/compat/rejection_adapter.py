"""Our rejection sampler in place of vLLM's, and min_p / logit_bias under speculation.

``SpecDecRejectionSampler``, the logits-processor builder and request validation. Why
and how: the ``_validate_spec_decode``, ``build_logitsprocs`` and ``RejectionSampler`` rows
of ``compat.patches``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from vllm_specdec_plugin.compat.seeded import gumbel_op_built


def is_ours(speculative_config: Any) -> bool:
    """True when a SpeculativeConfig selects one of this plugin's proposers."""
    from vllm_specdec_plugin.config import selects_plugin

    return speculative_config is not None and selects_plugin(
        getattr(speculative_config, "method", None), getattr(speculative_config, "model", None))


def wrap_validate_spec_decode(original: Any) -> Any:
    def _validate_spec_decode(self, speculative_config):  # noqa: ANN001
        if is_ours(speculative_config):
            return None  # our sampler honours min_p and logit_bias exactly
        return original(self, speculative_config)

    return _validate_spec_decode


def wrap_build_logitsprocs(original: Any) -> Any:
    from vllm.v1.sample import logits_processor as lp

    def build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model,
                          custom_logitsprocs=()):  # noqa: ANN001
        if is_ours(vllm_config.speculative_config) and not is_pooling_model and not custom_logitsprocs:
            # The builtin set (min_p, logit_bias, min_tokens) as without speculation:
            # the plain Sampler (steps without drafts) then honours min_p/logit_bias.
            return lp.LogitsProcessors(ctor(vllm_config, device, is_pin_memory)
                                       for ctor in lp.BUILTIN_LOGITS_PROCESSORS)
        return original(vllm_config, device, is_pin_memory, is_pooling_model,
                        custom_logitsprocs)

    return build_logitsprocs


def _make_sampler_class(base: type) -> type:
    """The ``RejectionSampler`` row's factory."""
    from vllm.v1.outputs import SamplerOutput

    class SpecDecRejectionSampler(base):  # type: ignore[misc, valid-type]
        """vLLM RejectionSampler whose forward runs the plugin's exact rejection sampling."""

        runner: Any = None
        exact_seconds = 0.0  # wall time of the exact path since the proposer last read it
        extra_positions = 0  # sampled positions it made beyond each row's first, since then

        def forward(self, metadata, draft_probs, logits, sampling_metadata):  # noqa: ANN001
            if metadata.max_spec_len == 0 and self._position_generators(sampling_metadata):
                # No row has drafts: logits are one row per request, what the runner
                # hands its Sampler without speculation. Same tokens, logprobs and cost.
                return self.sampler(logits=logits, sampling_metadata=sampling_metadata)
            runner = self.runner
            if runner is None or not _batch_known(runner, len(metadata.num_draft_tokens)):
                # vLLM's warm-up calls (dummy requests): numerics are irrelevant there.
                return super().forward(metadata, draft_probs, logits, sampling_metadata)
            t0 = time.perf_counter()
            made: list[int] = []
            out = exact_rejection_sample(runner, metadata, draft_probs, logits, made)
            self.extra_positions += sum(made)
            logprobs = None
            if sampling_metadata.max_num_logprobs is not None:
                logprobs = self._get_logprobs_tensors(
                    sampling_metadata.max_num_logprobs, metadata, logits,
                    logits[metadata.target_logits_indices].float(),
                    logits[metadata.bonus_logits_indices].float(), out)
            # what a verifying step costs beyond a plain one (σ, control.cost)
            self.exact_seconds += time.perf_counter() - t0
            return SamplerOutput(sampled_token_ids=out, logprobs_tensors=logprobs)

        def _position_generators(self, sampling_metadata) -> bool:  # noqa: ANN001
            """Set each seeded row's vLLM generator (vLLM gives only those one) to draw
            its next output token's seed from the stream the exact path replays
            (compat/seeded.py), so vLLM's own sampler samples the row as it would
            without speculation. False where that is not vLLM's noise (no CPU op, or
            float64 Gumbel noise): the exact path then samples every seeded row."""
            gens = sampling_metadata.generators
            if not gens:
                return True
            runner = self.runner
            if (runner is None or not gumbel_op_built()
                    or getattr(self.sampler.topk_topp_sampler, "use_fp64_gumbel", True)):
                return False
            ids = runner.input_batch.req_ids
            for i, gen in gens.items():
                state = runner.requests.get(ids[i]) if i < len(ids) else None
                if state is None or gen.device.type != "cpu":
                    return False
                gen.set_state(_seed_stream(runner, ids[i], state).state_at(
                    len(state.output_token_ids)))
            return True

    return SpecDecRejectionSampler


def _seed_stream(runner: Any, req_id: str, state: Any) -> Any:
    """A seeded request's ``token_draw.SeedStream``, the seeds of its emitted tokens
    released (not those of drafts ahead of them)."""
    stream = runner.drafter.seed_streams.get(req_id, state.sampling_params.seed,
                                             state.num_prompt_tokens)
    stream.release(len(state.output_token_ids))
    return stream


def _batch_known(runner: Any, batch_size: int) -> bool:
    ids = runner.input_batch.req_ids[:batch_size]
    return len(ids) == batch_size and all(r in runner.requests for r in ids)


def exact_rejection_sample(runner: Any, metadata: Any, draft_probs: torch.Tensor | None,
                           logits: torch.Tensor, made: list[int] | None = None) -> torch.Tensor:
    """Output token ids [B, K+1] int32 (placeholder -1) of one verification step, on
    vLLM's flat rows (metadata: SpecDecodeMetadata; draft_probs [drafts, V] | None;
    logits [drafts + B, V], per request its draft rows then bonus). ``made`` gets the
    sampled rows' positions past their first that the pipeline ran on (what a verify
    step's sampling adds to a plain step's: σ's third term, ``control.cost``)."""
    from vllm_specdec_plugin.rejection import (PLACEHOLDER_TOKEN_ID, TargetRows,
                                               greedy_verify, rejection_sample)
    from vllm_specdec_plugin.sampling.constraints import (apply_constraints,
                                                          constraints_from_sampling_params)
    from vllm_specdec_plugin.compat.seeded import seeded_tokens as seeded_tokens_of
    from vllm_specdec_plugin.sampling.pipeline import SamplingSpec, position_probs
    from vllm_specdec_plugin.token_draw import first_argmax

    num_draft = list(metadata.num_draft_tokens)
    B, K = len(num_draft), metadata.max_spec_len
    dev = logits.device
    req_ids = runner.input_batch.req_ids[:B]
    states = [runner.requests[r] for r in req_ids]

    # Flat row order: per request its drafts' target rows, then its bonus row.
    flat_drafts = metadata.draft_token_ids.tolist()
    tgt = metadata.target_logits_indices.tolist()
    bonus = metadata.bonus_logits_indices.tolist()
    order: list[int] = []
    drafts: list[list[int]] = []
    start = 0
    for b, n in enumerate(num_draft):
        order += tgt[start:start + n]
        order.append(bonus[b])
        drafts.append(flat_drafts[start:start + n])
        start += n
    if order != list(range(logits.shape[0])):
        # vLLM 0.32 lays the rows out in this order already; gather only if it didn't.
        logits = logits[torch.tensor(order, dtype=torch.int64, device=dev)]
    draft_ids = torch.full((B, max(K, 1)), PLACEHOLDER_TOKEN_ID, dtype=torch.int64)
    for b, d in enumerate(drafts):
        if d:
            draft_ids[b, : len(d)] = torch.tensor(d)
    draft_ids = draft_ids[:, :K].to(dev)
    n_t = torch.tensor(num_draft, dtype=torch.int64, device=dev)

    specs = [SamplingSpec.from_sampling_params(s.sampling_params) for s in states]
    constraints = [constraints_from_sampling_params(s.sampling_params) for s in states]
    constrained = any(c.active for c in constraints)
    if not constrained and all(s.takes_raw_argmax for s in specs):
        # Plain greedy batch: p_j would be the one-hot of argmax(logits_j); skip it.
        # On the model's dtype: float32 conversion is exact, and ties go to the lowest
        # id either way, as in vLLM's greedy_sample.
        argmax = first_argmax(logits)                                         # [T]
        counts = n_t + 1
        pos = torch.arange(K + 1, device=dev).unsqueeze(0)
        rows = (counts.cumsum(0) - counts).unsqueeze(1) + torch.minimum(pos, n_t.unsqueeze(1))
        return greedy_verify(draft_ids, n_t, argmax[rows]).to(torch.int32)
    outputs = [s.output_token_ids for s in states]
    if constrained:
        # In place, so on a copy: vLLM reads these logits again for logprobs.
        logits = apply_constraints(logits.to(torch.float32, copy=True), constraints,
                                   outputs, drafts)
    # Seeded sampled rows take vLLM's own noise for each output token (seeded.py): their
    # p rows stay processed logits, which its op samples from.
    seeded = [s.seed is not None and not s.is_greedy for s in specs]
    prompts = [s.prompt_token_ids or [] for s in states]
    owner = [b for b, n in enumerate(num_draft) for _ in range(n + 1)]   # [T] request
    pos = [j for n in num_draft for j in range(n + 1)]                   # [T] position
    streams = {}
    if any(seeded):
        # Output index of each row's first position: the outputs committed so far
        # (a chunked prefill's discarded partial steps sample index 0, as its last).
        # (Async scheduling would pad output_token_ids; vLLM 0.32 runs custom_class
        # proposers without it.)
        for b in (b for b in range(B) if seeded[b]):
            streams[b] = _seed_stream(runner, req_ids[b], states[b])

    def rows(idx: torch.Tensor) -> torch.Tensor:  # only the positions verification reaches
        if made is not None:
            made.append(sum(1 for r in idx.tolist() if pos[r] and not specs[owner[r]].is_greedy))
        return position_probs(logits, specs, prompts, outputs, drafts, keep_logits=seeded,
                              rows=idx.tolist())

    def seeded_rows(idx: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
        return torch.cat([seeded_tokens_of(got[i:i + 1], streams[owner[r]],
                                           len(outputs[owner[r]]) + pos[r])
                          for i, r in enumerate(idx.tolist())])

    target = TargetRows((logits.shape[0], logits.shape[1]), dev, rows,
                        seeded_rows if streams else None)
    is_greedy = torch.tensor([s.is_greedy for s in specs], dtype=torch.bool, device=dev)
    out, _ = rejection_sample(draft_ids, n_t, draft_probs, target, is_greedy, seeded)
    return out.to(torch.int32)
