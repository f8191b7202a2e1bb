"""Draft KV allocator and rollback-by-trimming, in isolation."""

import pytest

from vllm_specdec_plugin.kv import BlockAllocator, BlockTable


def test_reserve_and_slots_follow_block_table():
    a = BlockAllocator(num_blocks=4, block_size=4)
    t = BlockTable()
    a.reserve(t, 6)                      # 2 blocks for 6 tokens
    assert len(t.blocks) == 2 and a.num_free == 2
    slots = a.slots(t, 0, 6)
    b0, b1 = t.blocks
    assert slots == [b0 * 4 + i for i in range(4)] + [b1 * 4, b1 * 4 + 1]


@pytest.mark.parametrize("tokens,blocks", [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_block_boundaries(tokens, blocks):
    a = BlockAllocator(num_blocks=8, block_size=4)
    t = BlockTable()
    a.reserve(t, tokens)
    assert len(t.blocks) == blocks


def test_trim_frees_whole_tail_blocks_and_keeps_partial_block():
    a = BlockAllocator(num_blocks=8, block_size=4)
    t = BlockTable()
    a.reserve(t, 11)                      # 3 blocks
    t.num_tokens = 11
    a.trim(t, 5)                          # keeps 2 blocks: positions 0..4
    assert t.num_tokens == 5 and len(t.blocks) == 2 and a.num_free == 6
    a.trim(t, 4)                          # exactly on a boundary: 1 block
    assert len(t.blocks) == 1 and a.num_free == 7
    a.trim(t, 9)                          # never grows
    assert t.num_tokens == 4 and len(t.blocks) == 1


def _round(a, t, committed, k, accepted):
    """One speculation round as the proposer does it: cache committed + k-1 drafts,
    then roll back to committed + min(accepted, k-1)."""
    a.reserve(t, committed + k - 1)
    t.num_tokens = committed + k - 1
    valid = min(committed + accepted, t.num_tokens)
    a.trim(t, valid)
    return valid


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_rollback_none_and_all_accepted(k):
    a = BlockAllocator(num_blocks=16, block_size=4)
    t = BlockTable()
    assert _round(a, t, committed=7, k=k, accepted=0) == 7
    assert len(t.blocks) == 2                     # 7 tokens -> 2 blocks
    t2 = BlockTable()
    valid = _round(a, t2, committed=7, k=k, accepted=k)
    assert valid == 7 + k - 1                    # d_k's KV was never computed
    assert len(t2.blocks) == -(-valid // 4)
    a.release(t)
    a.release(t2)
    assert a.num_free == a.num_blocks


def test_k1_never_caches_drafts():
    a = BlockAllocator(num_blocks=4, block_size=4)
    t = BlockTable()
    assert _round(a, t, committed=3, k=1, accepted=1) == 3


def test_pool_exhaustion_is_reported_not_raised_by_can_reserve():
    a = BlockAllocator(num_blocks=2, block_size=4)
    t1, t2 = BlockTable(), BlockTable()
    assert a.can_reserve(t1, 8)
    a.reserve(t1, 8)
    assert not a.can_reserve(t2, 1)
    with pytest.raises(MemoryError):
        a.reserve(t2, 1)
    a.release(t1)
    assert a.can_reserve(t2, 8)


def test_release_returns_everything_after_many_rounds():
    import random

    rng = random.Random(0)
    a = BlockAllocator(num_blocks=64, block_size=16)
    tables = [BlockTable() for _ in range(6)]
    lens = [rng.randint(1, 40) for _ in tables]
    for _ in range(200):
        i = rng.randrange(len(tables))
        k = rng.randint(1, 6)
        if a.can_reserve(tables[i], lens[i] + k - 1):
            v = _round(a, tables[i], lens[i], k, rng.randint(0, k))
            lens[i] = v + 1
    for t in tables:
        a.release(t)
    assert a.num_free == a.num_blocks
