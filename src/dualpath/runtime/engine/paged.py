"""Paged KV cache of a decode engine (the DE's HBM): fixed blocks, block tables per request.

One preallocated tensor ``[num_blocks, layers, block_size, 2, kv_heads, head_dim]``: a cache block is
byte for byte a store Full Block, so copying in from the DE buffer and persisting out are whole-block
copies. ``allocate`` returns None when the blocks do not fit (ask before commit).
"""

from __future__ import annotations

import numpy as np
import torch

from dualpath.core.errors import ConfigError, require
from dualpath.runtime.engine.types import KVGeometry


class PagedKVCache:
    """Block allocator plus the cache tensor. Not thread-safe (the decode loop owns it)."""

    def __init__(self, geometry: KVGeometry, num_blocks: int, device: torch.device) -> None:
        require(num_blocks >= 1, "num_cache_blocks", num_blocks, "must be >= 1")
        self.geometry = geometry
        shape = (num_blocks, geometry.num_layers, geometry.block_size, *geometry.token_shape)
        self.data = torch.zeros(shape, dtype=geometry.dtype, device=device)
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, num_tokens: int) -> list[int] | None:
        """Blocks for ``num_tokens`` tokens, or None if not enough are free (nothing allocated)."""
        need = self.geometry.num_blocks(num_tokens)
        if need > len(self._free):
            return None
        return [self._free.pop() for _ in range(need)]

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(reversed(block_ids))

    def index(self, block_ids: list[int]) -> torch.Tensor:
        """A block table as an index tensor on the cache's device (build once per step)."""
        return torch.tensor(block_ids, dtype=torch.long, device=self.data.device)

    def gather(self, layer: int, table: torch.Tensor, length: int) -> torch.Tensor:
        """Tokens ``[0, length)`` of ``layer`` for a block table: ``[length, 2, kv, d]`` (a copy)."""
        blocks = self.data[:, layer].index_select(0, table[: self.geometry.num_blocks(length)])
        return blocks.view(-1, *self.geometry.token_shape)[:length]

    def write_token(self, layer: int, block_ids: list[int], pos: int, kv: torch.Tensor) -> None:
        """Store one token's KV (``[2, kv, d]``) at position ``pos`` of ``layer``."""
        block, off = divmod(pos, self.geometry.block_size)
        if block >= len(block_ids):
            raise ConfigError("pos", pos, f"beyond the {len(block_ids)} blocks allocated")
        self.data[block_ids[block], layer, off].copy_(kv)

    def block_bytes(self, block_id: int) -> np.ndarray:
        """A Full Block's bytes as uint8 (a view on CPU, a host copy on a GPU)."""
        block = self.data[block_id]
        if block.device.type != "cpu":
            block = block.cpu()
        return block.view(torch.uint8).reshape(-1).numpy()
