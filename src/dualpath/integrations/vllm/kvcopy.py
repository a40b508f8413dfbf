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
        part = self._token_major().index_select(0, idx)  # [b, N, 2, H, D], contiguous
        return part.view(len(block_ids) * self.block_size, 2, self.num_kv_heads, self.head_dim)

    def _token_major(self) -> torch.Tensor:
        """A (strided) view ``[num_blocks, block_size, 2, heads, head_dim]`` of the cache."""
        if self.kind == "cpu":
            return self._blocked().permute(0, 3, 2, 1, 4)
        return self.cache.permute(1, 2, 0, 3, 4)

    def gather_into(self, block_ids: torch.Tensor | Sequence[int], out: torch.Tensor) -> None:
        """``gather`` written into ``out``: contiguous, ``len(block_ids) * block_size *
        2 * heads * head_dim`` elements of the cache's dtype (a step's Layer Blocks of every
        request, back to back: one staging row of a layer). One ``index_select`` reading the cache
        in token-major order straight into ``out``: one copy, no intermediate."""
        if isinstance(block_ids, torch.Tensor):
            idx = block_ids.to(self.cache.device)
        else:
            idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.cache.device)
        if not out.is_contiguous():
            raise ConfigError("out", f"strides {out.stride()}", "must be contiguous")
        shape = (len(idx), self.block_size, 2, self.num_kv_heads, self.head_dim)
        if out.device == self.cache.device:
            torch.index_select(self._token_major(), 0, idx, out=out.view(shape))
        else:  # (a GPU cache into host staging: the select on the device, then one transfer)
            out.view(shape).copy_(self._token_major().index_select(0, idx))

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
