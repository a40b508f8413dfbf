"""Copies between one layer of vLLM's paged KV cache and the store's Layer Blocks (torch, no vLLM).

The store's Layer Block is token-major, ``[block_size tokens, 2 (K, V), kv_heads, head_dim]``: the
layout of ``dualpath serve``'s engine (``KVGeometry.token_shape``), so a block means the same bytes
whichever engine wrote it. vLLM's per-layer cache tensors come in two shapes:

- CPU backend ``[num_blocks, kv_heads, block_size, 2 * head_dim]``, whose memory per block is
  ``[kv_heads, 2, block_size, head_dim]`` (the backend views it as ``block_size * 2`` rows and
  splits K from V there), and
- flash-attention style ``[2, num_blocks, block_size, kv_heads, head_dim]``.

``PagedLayer`` gathers whole vLLM blocks into the store order and scatters them back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dualpath.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PagedLayer:
    """One layer's paged cache and how its blocks map to ``[tokens, 2, heads, head_dim]``."""

    cache: torch.Tensor
    kind: str  # "cpu" or "flash"
    block_size: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, cache: torch.Tensor, *, block_size: int, num_kv_heads: int, head_dim: int) -> PagedLayer:
        """Recognise ``cache``'s shape; ConfigError naming the shape when it is neither kind."""
        shape = tuple(cache.shape)
        if len(shape) == 4 and shape[1:] == (num_kv_heads, block_size, 2 * head_dim):
            kind = "cpu"
        elif len(shape) == 5 and shape[0] == 2 and shape[2:] == (block_size, num_kv_heads, head_dim):
            kind = "flash"
        else:
            raise ConfigError("kv_cache shape", str(shape), "not a vLLM layout this connector knows "
                              f"(block_size {block_size}, kv_heads {num_kv_heads}, head_dim {head_dim})")  # fmt: skip
        if not cache.is_contiguous():
            raise ConfigError("kv_cache", f"strides {cache.stride()}", "must be contiguous per layer")
        return cls(cache=cache, kind=kind, block_size=block_size, num_kv_heads=num_kv_heads,
                   head_dim=head_dim)  # fmt: skip

    @property
    def num_blocks(self) -> int:
        return int(self.cache.shape[1 if self.kind == "flash" else 0])

    def _blocked(self) -> torch.Tensor:
        """A view whose dim 0 is the block: cpu ``[B, H, 2, N, D]``, flash ``[2, B, N, H, D]``."""
        if self.kind == "cpu":
            return self.cache.view(self.num_blocks, self.num_kv_heads, 2, self.block_size, self.head_dim)
        return self.cache

    def gather(self, block_ids: Sequence[int]) -> torch.Tensor:
        """Blocks ``block_ids`` as a new contiguous ``[len * block_size, 2, heads, head_dim]``."""
        idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.cache.device)
        if self.kind == "cpu":
            part = self._blocked().index_select(0, idx).permute(0, 3, 2, 1, 4)  # [b, N, 2, H, D]
        else:
            part = self.cache.index_select(1, idx).permute(1, 2, 0, 3, 4)  # [b, N, 2, H, D]
        return part.reshape(len(block_ids) * self.block_size, 2, self.num_kv_heads, self.head_dim)

    def gather_into(self, block_ids: Sequence[int], out: torch.Tensor) -> None:
        """``gather`` written into ``out`` (``[len(block_ids) // k, k * block_size, 2, heads,
        head_dim]``, any strides between its dim-0 rows: a Layer Block slice of a Full Block
        staging buffer), one copy instead of three."""
        idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.cache.device)
        if self.kind == "cpu":
            part = self._blocked().index_select(0, idx).permute(0, 3, 2, 1, 4)  # [b, N, 2, H, D]
        else:
            part = self.cache.index_select(1, idx).permute(1, 2, 0, 3, 4)
        n = out.shape[0]
        k = len(block_ids) // n
        shape = (n, k, self.block_size, 2, self.num_kv_heads, self.head_dim)
        out.view(shape).copy_(part.view(shape))

    def scatter(self, block_ids: Sequence[int], tokens: torch.Tensor) -> None:
        """Write ``tokens`` (``[len * block_size, 2, heads, head_dim]``) into blocks ``block_ids``."""
        n = len(block_ids)
        idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.cache.device)
        src = tokens.to(self.cache.device, self.cache.dtype).view(
            n, self.block_size, 2, self.num_kv_heads, self.head_dim
        )
        if self.kind == "cpu":
            self._blocked().index_copy_(0, idx, src.permute(0, 3, 2, 1, 4))
        else:
            self.cache.index_copy_(1, idx, src.permute(2, 0, 1, 3, 4))
