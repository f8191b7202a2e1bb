"""Storage of the draft's paged KV cache and the batch layout for one draft forward.

The cache is two tensors per layer, ``[num_blocks * block_size, num_kv_heads,
head_dim]`` (flat slots), owned by the proposer and separate from the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class PagedKVCache:
    """K and V slot arrays for every draft layer."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int,
                 num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int,
                        head_dim: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * elem

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # slots [T] int64; k, v [T, num_kv_heads, head_dim]
        self.k[layer].index_copy_(0, slots, k.to(self.k.dtype))
        self.v[layer].index_copy_(0, slots, v.to(self.v.dtype))

    def gather(self, layer: int, kv_slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # kv_slots [B, L] int64 -> k, v [B, L, num_kv_heads, head_dim]
        return self.k[layer][kv_slots], self.v[layer][kv_slots]


@dataclass(slots=True)
class BatchLayout:
    """Padded per-request view of one draft forward over flat new tokens.

    Request row b has ``query_lens[b]`` new tokens at the end of a sequence of
    ``seq_lens[b]`` tokens. Flat token t is (token_rows[t], token_cols[t]) in the
    padded query batch.
    """

    positions: torch.Tensor    # [T] int64: absolute position of flat token t
    new_slots: torch.Tensor    # [T] int64: cache slot where token t's KV is written
    token_rows: torch.Tensor   # [T] int64: request row b of flat token t
    token_cols: torch.Tensor   # [T] int64: query column j of flat token t
    kv_slots: torch.Tensor     # [B, L] int64: cache slot of key position l (pads: valid dummy)
    mask: torch.Tensor         # [B, 1, Q, L] bool: query may attend key
    last_token: torch.Tensor   # [B] int64: flat index of each request's last new token
    num_rows: int
    max_query: int

    @staticmethod
    def build(query_lens: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
              block_size: int) -> "BatchLayout":
        """query_lens, seq_lens [B] int64 (CPU); block_tables [B, NB] int64 (pad 0),
        on the cache's device. All index maths is vectorised: no per-token Python."""
        dev = block_tables.device
        B = int(query_lens.numel())
        Q = int(query_lens.max())
        L = int(seq_lens.max())
        pos = torch.arange(L, device=dev)
        blk = torch.clamp(pos // block_size, max=block_tables.shape[1] - 1)
        kv_slots = block_tables[:, blk] * block_size + (pos % block_size)       # [B, L]
        ql, sl = query_lens.to(dev), seq_lens.to(dev)
        start = sl - ql                                                          # [B]
        cols = torch.arange(Q, device=dev)
        valid_q = cols[None, :] < ql[:, None]                                    # [B, Q]
        token_rows, token_cols = valid_q.nonzero(as_tuple=True)                  # row-major
        positions = start[token_rows] + token_cols
        qpos = start[:, None] + cols[None, :]                                    # [B, Q]
        mask = (pos[None, None, :] <= qpos[:, :, None]) & (pos[None, None, :] < sl[:, None, None])
        return BatchLayout(
            positions=positions,
            new_slots=kv_slots[token_rows, positions],
            token_rows=token_rows,
            token_cols=token_cols,
            kv_slots=kv_slots,
            mask=mask[:, None],
            last_token=torch.cumsum(ql, 0) - 1,
            num_rows=B,
            max_query=Q,
        )
