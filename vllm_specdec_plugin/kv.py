"""The draft model's own paged KV bookkeeping: block allocator and block tables.

Pure Python (no torch): a free list of block ids, and for each request a table of the
blocks holding its tokens' KV. Token ``t`` of a request lives in slot
``table.blocks[t // block_size] * block_size + t % block_size`` of the flat cache, whose
tensors ``compat/draft_model.py`` allocates in the attention backend's layout.

Rollback is a length change: ``trim(n)`` keeps the first ``n`` tokens, returns whole
tail blocks to the free list and keeps a partial last block; stale slots in it are
overwritten by the next write (nano-vllm / sglang style).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class BlockTable:
    """One request's draft KV: its blocks and how many tokens they hold."""

    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0  # tokens whose KV is valid, positions [0, num_tokens)


class BlockAllocator:
    """Free-list allocator over ``num_blocks`` blocks of ``block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks>=1 and block_size>=1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, table: BlockTable, num_tokens: int) -> int:
        """Extra blocks ``table`` needs to hold ``num_tokens`` tokens in total."""
        want = -(-num_tokens // self.block_size)  # ceil
        return max(0, want - len(table.blocks))

    def can_reserve(self, table: BlockTable, num_tokens: int) -> bool:
        return self.blocks_needed(table, num_tokens) <= len(self._free)

    def reserve(self, table: BlockTable, num_tokens: int) -> None:
        """Grow ``table`` so it can hold ``num_tokens`` tokens (call can_reserve first)."""
        need = self.blocks_needed(table, num_tokens)
        if need > len(self._free):
            raise MemoryError(f"draft KV pool: need {need} blocks, {len(self._free)} free")
        for _ in range(need):
            table.blocks.append(self._free.popleft())

    def trim(self, table: BlockTable, num_tokens: int) -> None:
        """Roll ``table`` back to its first ``num_tokens`` tokens; free whole tail blocks."""
        if num_tokens < 0:
            raise ValueError(f"cannot trim to {num_tokens} tokens")
        table.num_tokens = min(table.num_tokens, num_tokens)
        keep = -(-table.num_tokens // self.block_size)
        while len(table.blocks) > keep:
            self._free.append(table.blocks.pop())

    def release(self, table: BlockTable) -> None:
        """Free every block of ``table`` (request finished, aborted or preempted)."""
        self.trim(table, 0)

    def slots(self, table: BlockTable, start: int, end: int) -> list[int]:
        """Flat cache slots of token positions [start, end) (blocks must be reserved)."""
        bs = self.block_size
        blocks = table.blocks
        return [blocks[t // bs] * bs + t % bs for t in range(start, end)]
