"""Per-step buffers that grow with the vocabulary, sized for the start-up memory log.

At a real vocabulary these are not small: 32 requests drafting 8 tokens each over
V = 49,152 make each float32 [rows, k + 1, V] buffer 57 MB, and vLLM's KV sizing
(its dummy sampler run verifies one draft per request) does not reserve them.
Pure arithmetic; imports nothing.
"""

from __future__ import annotations


def vocab_buffers(max_rows: int, k: int, vocab: int, logits_bytes: int,
                  draft_model: bool) -> dict[str, int]:
    """Bytes of each [.., V] buffer of one step at ``max_rows`` requests drafting ``k``
    tokens each (vLLM's ``max_num_seqs`` and ``num_speculative_tokens``).

    target_logits: the verify forward's logits, [rows·(k+1), V] in the target's dtype;
    verify_float32: the rejection sampler's float32 working copy of them;
    draft_q: sampled rows' draft distributions, [rows, k, V] float32, held across the
    target's forward; draft_logits: one draft round's logits, [rows, V] float32.
    The n-gram source has no draft_q or draft_logits (its drafts are point masses).
    """
    verify_rows = max_rows * (k + 1)
    out = {"target_logits": verify_rows * vocab * logits_bytes,
           "verify_float32": verify_rows * vocab * 4}
    if draft_model:
        out.update(draft_q=max_rows * k * vocab * 4, draft_logits=max_rows * vocab * 4)
    return out


def describe(buffers: dict[str, int]) -> str:
    """``name MiB`` pairs and their total, for one log line."""
    parts = ", ".join(f"{name} {b / 2**20:.1f}" for name, b in buffers.items())
    return f"{parts}; total {sum(buffers.values()) / 2**20:.1f} MiB"
