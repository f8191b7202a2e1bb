"""The draft model's own paged KV bookkeeping: block allocator and block tables.

The KV tensors themselves are allocated in the attention backend's layout by
``compat/draft_model.py``; block ids here index them."""

from vllm_specdec_plugin.kv.block_allocator import BlockAllocator, BlockTable

__all__ = ["BlockAllocator", "BlockTable"]
