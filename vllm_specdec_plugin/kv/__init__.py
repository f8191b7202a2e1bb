"""The draft model's own paged KV cache: block allocator, block tables, storage."""

from vllm_specdec_plugin.kv.block_allocator import BlockAllocator, BlockTable
from vllm_specdec_plugin.kv.paged_cache import PagedKVCache

__all__ = ["BlockAllocator", "BlockTable", "PagedKVCache"]
