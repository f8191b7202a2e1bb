"""Hard constraints at speculative positions (min_tokens, allowed ids, bad words)."""

import random

import pytest
import torch

from vllm_specdec_plugin.sampling.constraints import TokenConstraints, apply_constraints


def test_min_tokens_forbids_stop_tokens_until_reached_per_position():
    c = TokenConstraints(min_tokens=3, stop_token_ids=(1, 2))
    logits = torch.zeros(4, 8)                            # flat: one request, k = 3
    apply_constraints(logits, [c], [[5]], [[6, 7, 4]])   # history lengths 1, 2, 3, 4
    banned = torch.isinf(logits[:, [1, 2]]).all(-1).tolist()
    assert banned == [True, True, False, False]


def test_allowed_token_ids_mask_everything_else():
    c = TokenConstraints(allowed_token_ids=(0, 3))
    logits = torch.zeros(2, 5)
    apply_constraints(logits, [c], [[]], [[3]])
    assert torch.isfinite(logits).nonzero()[:, 1].tolist() == [0, 3, 0, 3]


def test_bad_words_match_vllm_with_drafts():
    vllm_bw = pytest.importorskip("vllm.v1.sample.ops.bad_words")
    rng = random.Random(0)
    for _ in range(200):
        words = [[rng.randrange(6) for _ in range(rng.randint(1, 3))] for _ in range(3)]
        out = [rng.randrange(6) for _ in range(rng.randint(0, 4))]
        drafts = [rng.randrange(6) for _ in range(rng.randint(0, 3))]
        ours = torch.zeros(len(drafts) + 1, 6)
        apply_constraints(ours, [TokenConstraints(bad_words=tuple(map(tuple, words)))], [out], [drafts])
        ref = torch.zeros(len(drafts) + 1, 6)
        for j in range(len(drafts) + 1):
            vllm_bw._apply_bad_words_single_batch(ref[j], words, out + drafts[:j])
        assert torch.equal(torch.isinf(ours), torch.isinf(ref)), (words, out, drafts)


def test_inactive_rows_untouched():
    logits = torch.randn(6, 7)
    before = logits.clone()
    apply_constraints(logits, [TokenConstraints(), TokenConstraints()], [[1], [2]], [[3, 4], [5, 6]])
    assert torch.equal(logits, before)


def test_flat_rows_follow_each_requests_own_k():
    """Request b's rows are its k_b + 1 positions, right after request b - 1's."""
    c = TokenConstraints(min_tokens=2, stop_token_ids=(0,))
    logits = torch.zeros(2 + 1 + 3, 4)                      # k = 1, 0, 2
    apply_constraints(logits, [c, TokenConstraints(), c], [[], [9], [7]], [[1], [], [2, 3]])
    banned = torch.isinf(logits[:, 0]).tolist()
    assert banned == [True, True, False, True, False, False]
    with pytest.raises(ValueError):
        apply_constraints(torch.zeros(5, 4), [c], [[]], [[1]])
