"""vLLM's own top-k / top-p op, for the sampling pipeline's step 7.

Why: p on a speculative step must be the distribution vLLM's Sampler samples from.
  Among exactly equal logits at a top-k or top-p boundary the kept set depends on the
  algorithm (``torch.sort``'s order on CPU, a Triton kernel on GPU), so a copy of one
  of them matches vLLM on one platform only; calling vLLM's dispatcher matches it on
  every platform.
How: ``v1.sample.ops.topk_topp_sampler.apply_top_k_top_p``, the function every
  ``TopKTopPSampler.forward_*`` calls first (Triton where vLLM has it, else the PyTorch
  path, which skips the full sort for top-k alone on CPU). It may write into logits.
Upstream: a public sampler-ops API, or a rejection-sampler plugin point that hands us
  vLLM's processed target logits per draft position.
Remove when: vLLM's own speculative sampling path is exact and honours every
  sampling parameter (then the whole pipeline goes).
"""

from __future__ import annotations

from typing import Any


def apply_top_k_top_p(logits: Any, top_k: Any, top_p: Any) -> Any:
    """logits [N, V] float32 (may be modified in place); top_k [N] int64 in 1..V (V is
    off) or None; top_p [N] float32 in (0, 1] (1 is off) or None. Returns [N, V] with
    the cut tokens at -inf."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p as vllm_op

    return vllm_op(logits, top_k, top_p)
