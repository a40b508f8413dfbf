"""Paged KV cache of a decode engine (the DE's HBM): fixed blocks, block tables per request.

One preallocated tensor ``[layers, num_blocks, block_size, 2, kv_heads, head_dim]`` (layer-major):
cache block ``b`` is ``data[:, b]``, a store Full Block ``[layers, block_size, 2, kv, d]`` (copied in
from the DE buffer, copied out to persist). Layer-major means the blocks of a request that got one
run of consecutive ids (``allocate`` looks for one first) are, for each layer, one contiguous
``[tokens, 2, kv, d]`` range: ``context`` returns it as a view and decode attention reads the cache
in place. Requests whose blocks are scattered are gathered (a copy). ``allocate`` returns None when
the blocks do not fit (ask before commit).
"""

from __future__ import annotations

import bisect

import numpy as np
import torch

from dualpath.core.errors import ConfigError, require
from dualpath.runtime.engine.types import KVGeometry


class PagedKVCache:
    """Block allocator plus the cache tensor. Not thread-safe (the decode loop owns it)."""

    def __init__(self, geometry: KVGeometry, num_blocks: int, device: torch.device) -> None:
        require(num_blocks >= 1, "num_cache_blocks", num_blocks, "must be >= 1")
        self.geometry = geometry
        shape = (geometry.num_layers, num_blocks, geometry.block_size, *geometry.token_shape)
        self.data = torch.zeros(shape, dtype=geometry.dtype, device=device)
        self._free = list(range(num_blocks))  # sorted ascending

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, num_tokens: int) -> list[int] | None:
        """Blocks for ``num_tokens`` tokens, or None if not enough are free (nothing allocated).

        The first run of ``need`` consecutive free ids if there is one (so ``context`` is a view),
        else the lowest free ids."""
        need = self.geometry.num_blocks(num_tokens)
        if need > len(self._free):
            return None
        free, run = self._free, 0
        for i in range(len(free) if need else 0):
            run = run + 1 if i and free[i] == free[i - 1] + 1 else 1
            if run == need:
                pick = free[i + 1 - need : i + 1]
                del free[i + 1 - need : i + 1]
                return pick
        pick = free[:need]
        del free[:need]
        return pick

    def free(self, block_ids: list[int]) -> None:
        for b in block_ids:
            bisect.insort(self._free, b)

    def index(self, block_ids: list[int]) -> torch.Tensor:
        """A block table as an index tensor on the cache's device (build once per request)."""
        return torch.tensor(block_ids, dtype=torch.long, device=self.data.device)

    @staticmethod
    def run_start(block_ids: list[int]) -> int | None:
        """The first id when ``block_ids`` are consecutive (one run), else None."""
        if (
            block_ids
            and block_ids[-1] - block_ids[0] == len(block_ids) - 1
            and all(b == block_ids[0] + i for i, b in enumerate(block_ids))
        ):
            return block_ids[0]
        return None

    def context(self, layer: int, run_start: int | None, table: torch.Tensor, length: int) -> torch.Tensor:
        """Tokens ``[0, length)`` of ``layer``: a view of the cache when the request's blocks are one
        run starting at ``run_start``, else a gather through ``table`` (a copy)."""
        if run_start is None:
            return self.gather(layer, table, length)
        nb = self.geometry.num_blocks(length)
        return self.data[layer, run_start : run_start + nb].view(-1, *self.geometry.token_shape)[:length]

    def gather(self, layer: int, table: torch.Tensor, length: int) -> torch.Tensor:
        """Tokens ``[0, length)`` of ``layer`` for a block table: ``[length, 2, kv, d]`` (a copy)."""
        blocks = self.data[layer].index_select(0, table[: self.geometry.num_blocks(length)])
        return blocks.view(-1, *self.geometry.token_shape)[:length]

    def write_block(self, block_id: int, full_block: torch.Tensor) -> None:
        """Copy a Full Block tensor ``[layers, block_size, 2, kv, d]`` into cache block ``block_id``."""
        self.data[:, block_id].copy_(full_block)

    def write_token(self, layer: int, block_ids: list[int], pos: int, kv: torch.Tensor) -> None:
        """Store one token's KV (``[2, kv, d]``) at position ``pos`` of ``layer``."""
        block, off = divmod(pos, self.geometry.block_size)
        if block >= len(block_ids):
            raise ConfigError("pos", pos, f"beyond the {len(block_ids)} blocks allocated")
        self.data[layer, block_ids[block], off].copy_(kv)

    def block_bytes(self, block_id: int) -> np.ndarray:
        """A Full Block's bytes as a new uint8 host array (the block is strided in the cache)."""
        block = self.data[:, block_id]
        if block.device.type != "cpu":
            block = block.contiguous().cpu()
        else:  # a copy even where the view happens to be contiguous: the write may outlive the block
            block = block.clone(memory_format=torch.contiguous_format)
        return block.view(torch.uint8).reshape(-1).numpy()
