"""vLLM's own penalty op, for the sampling pipeline's step 3.

Why: p on a speculative step must be bit-identical to p on a plain step on every
  platform. vLLM's Sampler applies repetition/presence/frequency penalties through
  ``model_executor.layers.utils.apply_penalties``, which on CUDA calls a custom kernel
  (``_custom_ops.apply_repetition_penalties_cuda``) whose last bit may differ from a
  torch re-implementation; so we call the same function, not a copy.
How: a thin re-export; the pipeline passes padded token tensors (pad = vocab size),
  exactly what vLLM's ``apply_all_penalties`` passes.
Upstream: a public penalties API, or a rejection-sampler plugin point that hands us
  vLLM's processed target logits per draft position.
Remove when: vLLM's own speculative sampling path is exact and honours every
  sampling parameter (then the whole pipeline goes).
"""

from __future__ import annotations

from typing import Any


def apply_penalties(logits: Any, prompt_tokens: Any, output_tokens: Any, presence: Any,
                    frequency: Any, repetition: Any) -> Any:
    """In place on logits [N, V] float32; token tensors [N, L] int64 padded with V;
    penalties [N] float32."""
    from vllm.model_executor.layers.utils import apply_penalties as vllm_apply_penalties

    return vllm_apply_penalties(logits, prompt_tokens, output_tokens, presence, frequency,
                                repetition)
