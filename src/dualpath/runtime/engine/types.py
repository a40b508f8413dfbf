"""Boundary types of the engines: KV geometry, requests and outputs (sampling parameters are the
cluster API's ``SamplingParams``, re-exported here)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import torch

from dualpath.core.errors import require
from dualpath.policy.views import READ_SIDES, ReadSide
from dualpath.runtime.cluster.api import SamplingParams  # the one sampling type (engines and API)
from dualpath.runtime.kvstore import BlockLayout, ReadResult, loadable_hit_blocks
from dualpath.runtime.model.config import DecoderConfig
from dualpath.runtime.transfer import TransferHandle


@dataclass(frozen=True, slots=True, kw_only=True)
class KVGeometry:
    """How KV bytes map to tensors. One token of one layer is ``[2, num_kv_heads, head_dim]``
    (K then V) in ``dtype``; a Full Block is ``[num_layers, block_size, 2, kv_heads, head_dim]``,
    which is byte for byte the store's ``[layers, block_size, kv_bytes_per_token_layer]``."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int = 64

    def __post_init__(self) -> None:
        require(self.block_size >= 1, "block_size", self.block_size, "must be >= 1")

    @classmethod
    def of(cls, config: DecoderConfig, dtype: torch.dtype, block_size: int = 64) -> KVGeometry:
        return cls(num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
                   head_dim=config.head_dim, dtype=dtype, block_size=block_size)  # fmt: skip

    @property
    def token_shape(self) -> tuple[int, int, int]:
        return (2, self.num_kv_heads, self.head_dim)

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """Bytes of one ``token_shape`` entry in ``dtype``."""
        return math.prod(self.token_shape) * self.dtype.itemsize

    @property
    def layout(self) -> BlockLayout:
        return BlockLayout(num_layers=self.num_layers, block_size=self.block_size,
                           kv_bytes_per_token_layer=self.kv_bytes_per_token_layer)  # fmt: skip

    @property
    def full_block_bytes(self) -> int:
        return self.layout.full_block_bytes

    def num_blocks(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens (the last may be partial)."""
        return -(-num_tokens // self.block_size)

    def padded_len(self, num_tokens: int) -> int:
        """``num_tokens`` rounded up to whole blocks."""
        return self.num_blocks(num_tokens) * self.block_size

    def max_hit_blocks(self, prompt_len: int) -> int:
        """Whole cached blocks a prompt may load (``kvstore.loadable_hit_blocks``)."""
        return loadable_hit_blocks(prompt_len, self.block_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillRequest:
    """A prompt to prefill on a PE. ``hit_hashes``: its cached prefix blocks (from
    ``BlockStore.match_prefix``), read as the policy's ``read_side`` says: by the PE itself ("pe"),
    by the DE named ``decode_endpoint`` into its buffer ("de"), or "split": the first
    ``split_block`` blocks by the PE, the rest by the DE, which pushes them into the PE buffer. The
    miss KV (and, on the PE and split paths, the hit KV) of every layer is sent to
    ``decode_endpoint``. ``first_step``: the sampling step of the token this prefill samples (0;
    ``k`` for a request resuming after ``k`` generated tokens, which are the end of ``token_ids``)."""

    request_id: str
    token_ids: tuple[int, ...]
    decode_endpoint: str
    read_side: ReadSide = "pe"
    hit_hashes: tuple[str, ...] = ()
    split_block: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    first_step: int = 0

    def __post_init__(self) -> None:
        require(len(self.token_ids) >= 1, "token_ids", len(self.token_ids), "prompt must not be empty")
        require(self.first_step >= 0, "first_step", self.first_step, "must be >= 0")
        require(
            self.read_side in READ_SIDES, "read_side", self.read_side, f"choices: {', '.join(READ_SIDES)}"
        )
        if self.read_side == "split":
            require(
                0 < self.split_block < len(self.hit_hashes),
                "split_block",
                self.split_block,
                f"a split read needs both shares: in (0, {len(self.hit_hashes)})",
            )
        else:
            require(
                self.split_block == 0,
                "split_block",
                self.split_block,
                f"only a split read has one (read_side {self.read_side!r})",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillOutput:
    """A finished prefill: the first generated token and the last prompt position's logits.

    All of the prompt's KV has been delivered to the DE buffer when this is returned."""

    request_id: str
    first_token: int
    logits: torch.Tensor
    hit_tokens: int
    computed_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeOutput:
    """One generated token of one request; ``finished`` after the last one."""

    request_id: str
    token: int
    logits: torch.Tensor
    finished: bool


class RemoteKV(Protocol):
    """DE-side access the PE needs on the DE and split read paths (implemented by DecodeEngine
    in-process; by control messages across processes)."""

    def loaded_hit_tokens(self, request_id: str) -> int | None:
        """Hit tokens the DE buffer holds for the request (None while its reads are in flight)."""
        ...

    def request_layer(self, request_id: str, layer: int, start: int, stop: int, dest: str) -> TransferHandle:
        """Send tokens ``[start, stop)`` of ``layer`` from the DE buffer to endpoint ``dest``."""
        ...

    def pushed_share(
        self, request_id: str, first_block: int, hashes: Sequence[str], dest: str
    ) -> list[Future[ReadResult]]:
        """Split read: the DE reads hit blocks ``hashes`` (the request's blocks from
        ``first_block`` on) and pushes every layer of them to the PE buffer at endpoint ``dest``.
        One future per block, resolved once all its layers arrived (``ok`` False from the first
        block the DE could not read: the PE recomputes from there)."""
        ...


def layer_items_spans(start: int, stop: int, block_size: int) -> Sequence[tuple[int, int, int]]:
    """Split token range ``[start, stop)`` into ``(block_index, token_offset, num_tokens)`` pieces."""
    out, pos = [], start
    while pos < stop:
        block, off = divmod(pos, block_size)
        n = min(block_size - off, stop - pos)
        out.append((block, off, n))
        pos += n
    return out
