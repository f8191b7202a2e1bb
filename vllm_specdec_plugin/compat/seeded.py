"""vLLM's own CPU sampling op, for seeded sampled rows: the plugin's text equals vLLM's.

vLLM 0.32's CPU sampler (``TopKTopPSampler.forward_cpu``) samples a seeded request's
output token i as ``_C.fused_gumbel_argmax(processed logits, seed_i)``: a Gumbel-max
with per-token SplitMix64 noise, seed_i its i-th ``randint(0, 2**31)`` draw from the
request's generator (``token_draw.SeedStream`` replays that stream). Verifying and
drafting a seeded row with the same op and seeds makes its output vLLM's own
whatever is drafted; in a step without drafts, vLLM's own sampler draws the row's seed
from its generator, set to the stream's state (``compat.rejection_adapter``). Reads
only; patches nothing.
Upstream: a public sampling-op API (or a rejection-sampler hook that hands over
vLLM's own noise per position).
Remove when: vLLM's speculative path samples seeded rows from their own stream.
"""

from __future__ import annotations

import torch

_op = None


def gumbel_op_built() -> bool:
    """True where vLLM's CPU op is built (its CPU wheels; not its CUDA ones)."""
    global _op
    if _op is None:
        try:
            import vllm._custom_ops  # noqa: F401 - registers torch.ops._C on CPU builds

            _op = torch.ops._C.fused_gumbel_argmax
        except (ImportError, AttributeError, RuntimeError):
            _op = False
    return _op is not False


def gumbel_argmax(logits: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor | None:
    """vLLM's seeded token per row: logits [n, V] float32 (processed: temperature,
    min_p, top-k/top-p applied), seeds [n] int64. None where the op is not built
    (vLLM's CUDA wheels): the caller then races on its own noise."""
    if not gumbel_op_built() or logits.device.type != "cpu":
        return None
    return _op(logits.to(torch.float32).contiguous(), seeds.to(torch.long))


def seeded_tokens(logits: torch.Tensor, stream, start: int) -> torch.Tensor:
    """A seeded request's tokens at output indices start .. start + n - 1: logits [n, V]
    float32 processed by its sampling pipeline (``keep_logits``), stream its
    ``token_draw.SeedStream``. vLLM's own op and seeds where built; else the race
    first_argmax(softmax(logits) / E_t) on the stream's position-keyed noise."""
    from vllm_specdec_plugin.token_draw import coupled_token

    n = logits.shape[0]
    seeds = torch.tensor(stream.seeds(start, n), dtype=torch.long)
    out = gumbel_argmax(logits, seeds)
    if out is not None:
        return out.to(logits.device)
    probs = torch.softmax(logits.to(torch.float32), dim=-1)
    return coupled_token(probs, stream.noise(start, n, logits.shape[1], logits.device))
