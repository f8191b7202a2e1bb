"""The start-up log's count of per-step buffers that grow with the vocabulary."""


def test_vocab_buffers_at_a_real_vocabulary():
    from vllm_specdec_plugin.vocab_memory import describe, vocab_buffers

    b = vocab_buffers(32, 8, 49152, 2, draft_model=True)
    assert b["verify_float32"] == 32 * 9 * 49152 * 4          # 54 MiB
    assert b["target_logits"] == b["verify_float32"] // 2     # bf16 logits
    assert b["draft_q"] == 32 * 8 * 49152 * 4 and b["draft_logits"] == 32 * 49152 * 4
    assert set(vocab_buffers(32, 8, 49152, 2, draft_model=False)) == {"target_logits", "verify_float32"}
    assert describe(b).endswith(f"total {sum(b.values()) / 2**20:.1f} MiB")
