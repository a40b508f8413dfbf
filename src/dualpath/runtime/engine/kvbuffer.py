"""Host DRAM KV buffer of one engine (the PE buffer or the DE buffer of spec section 4).

Preallocated and bounded in bytes: one arena of Full-Block-sized slots, touched once.
A request owns ``ceil(prompt_len / block_size)`` slots holding its prompt KV in the Full Block layout
``[layers, block_size, 2, kv_heads, head_dim]``. The buffer is a ``KVSink``: Layer/Full Blocks sent
to its endpoint are written into the owning request's slots. It also serves layer reads to a remote PE
(DE read path) by submitting Layer Blocks through a transport.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np
import torch

from dualpath.core.errors import ConfigError
from dualpath.runtime.engine.types import KVGeometry, layer_items_spans
from dualpath.runtime.kvstore import IOEngine, ReadResult
from dualpath.runtime.transfer import FULL_BLOCK, TransferHandle, TransferItem, Transport


def payload_tensor(item: TransferItem, geometry: KVGeometry) -> torch.Tensor:
    """The item's payload as a ``[num_tokens, 2, kv, d]`` tensor (Layer) or a Full Block tensor."""
    p = item.payload
    if not isinstance(p, torch.Tensor):
        with warnings.catch_warnings():  # read-only bytes: we only read from the view
            warnings.simplefilter("ignore", UserWarning)
            p = torch.frombuffer(p, dtype=torch.uint8)
    if p.dtype != geometry.dtype:
        p = p.contiguous().view(torch.uint8).view(geometry.dtype)
    if item.layer == FULL_BLOCK:
        return p.reshape(geometry.num_layers, geometry.block_size, *geometry.token_shape)
    return p.reshape(item.num_tokens, *geometry.token_shape)


def loaded_prefix_tokens(reads: Sequence[Future[ReadResult]], block_size: int) -> int | None:
    """Tokens of the leading run of successful block reads (``load_from_store``'s futures, in
    block order); None while any of them is in flight. A miss or a failed read ends the usable
    prefix: the engine recomputes the rest."""
    if not all(f.done() for f in reads):
        return None
    num_ok = 0
    for f in reads:
        if f.exception() is not None or not f.result().ok:
            break
        num_ok += 1
    return num_ok * block_size


class RequestBlocks:
    """The slots of one request. ``tensors[j]`` views its block j as a Full Block tensor, ``arrays[j]``
    as the uint8 array the store reads into; ``slots`` indexes the buffer's arena (a whole-block gather
    into a block-padded destination is one ``index_select``)."""

    __slots__ = ("slots", "index", "tensors", "arrays", "_arena")

    def __init__(self, slots: list[int], arena: torch.Tensor, raw: torch.Tensor) -> None:
        self.slots = slots
        self.index = torch.tensor(slots, dtype=torch.long)
        self._arena = arena  # [num_slots, layers, block_size, 2, kv, d]
        self.tensors = [arena[s] for s in slots]
        self.arrays: list[np.ndarray] = [raw[s].numpy() for s in slots]

    def read_tokens(self, layer: int, start: int, stop: int, out: torch.Tensor) -> None:
        """Copy tokens ``[start, stop)`` of ``layer`` into ``out`` (``[stop - start, 2, kv, d]``).

        From token 0 into a block-padded ``out`` (``ceil(stop / block_size) * block_size`` tokens) on the
        buffer's device, the copy is a single gather."""
        bs = self.tensors[0].shape[1]
        nb = -(-stop // bs)
        if (
            start == 0
            and out.shape[0] >= nb * bs
            and out.is_contiguous()
            and out.device == self._arena.device
        ):
            torch.index_select(self._arena[:, layer], 0, self.index[:nb],
                               out=out[: nb * bs].view(nb, bs, *out.shape[1:]))  # fmt: skip
            return
        for block, off, n in layer_items_spans(start, stop, bs):
            dst = block * bs + off - start
            out[dst : dst + n].copy_(self.tensors[block][layer, off : off + n], non_blocking=True)

    def write_tokens(self, layer: int, start: int, kv: torch.Tensor) -> None:
        """Write ``kv`` (``[n, 2, kv, d]``) as tokens ``[start, start + n)`` of ``layer``."""
        bs = self.tensors[0].shape[1]  # (an index_copy_ scatter measured no faster than this loop)
        for block, off, k in layer_items_spans(start, start + kv.shape[0], bs):
            src = block * bs + off - start
            self.tensors[block][layer, off : off + k].copy_(kv[src : src + k])


class KVBuffer:
    """A bounded pool of Full-Block slots assigned to requests. Thread-safe for allocate/free/deliver.

    One preallocated, touched arena of ``capacity_bytes // full_block_bytes`` slots."""

    def __init__(self, geometry: KVGeometry, capacity_bytes: int, *, name: str = "") -> None:
        if capacity_bytes < geometry.full_block_bytes:
            raise ConfigError("buffer_bytes", capacity_bytes,
                              f"must hold at least one Full Block ({geometry.full_block_bytes} bytes)")  # fmt: skip
        self.geometry = geometry
        self.name = name
        num_slots = capacity_bytes // geometry.full_block_bytes
        self._raw = torch.zeros(num_slots, geometry.full_block_bytes, dtype=torch.uint8)  # touched
        shape = (num_slots, geometry.num_layers, geometry.block_size, *geometry.token_shape)
        self._arena = self._raw.view(geometry.dtype).view(shape)
        self._free = list(range(num_slots - 1, -1, -1))
        self._reqs: dict[str, RequestBlocks] = {}
        self._lock = threading.Lock()

    @property
    def capacity_bytes(self) -> int:
        return self._raw.numel()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, request_id: str, num_tokens: int) -> RequestBlocks | None:
        """Slots for ``num_tokens`` tokens, all or nothing; None when they do not fit now."""
        with self._lock:
            if request_id in self._reqs:
                raise ConfigError("request_id", request_id, f"already has blocks in buffer {self.name!r}")
            need = self.geometry.num_blocks(num_tokens)
            if need > len(self._free):
                return None
            blocks = RequestBlocks([self._free.pop() for _ in range(need)], self._arena, self._raw)
            self._reqs[request_id] = blocks
            return blocks

    def blocks(self, request_id: str) -> RequestBlocks:
        try:
            return self._reqs[request_id]
        except KeyError:
            raise ConfigError("request_id", request_id, f"has no blocks in buffer {self.name!r}") from None

    def free(self, request_id: str) -> None:
        """Return the request's slots to the pool (no-op if it has none)."""
        with self._lock:
            blocks = self._reqs.pop(request_id, None)
            if blocks is not None:
                self._free.extend(reversed(blocks.slots))

    def load_from_store(
        self, request_id: str, hashes: Sequence[str], io: IOEngine
    ) -> list[Future[ReadResult]]:
        """Queue reads of ``hashes`` (Full Blocks) into the request's first slots, in order."""
        arrays = self.blocks(request_id).arrays
        return io.submit_blocks(list(hashes), outs=arrays[: len(hashes)])

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        """KVSink: write arriving Layer/Full Blocks into the owning requests' slots."""
        for item in items:
            blocks = self.blocks(item.key)
            data = payload_tensor(item, self.geometry)
            if item.layer == FULL_BLOCK:
                blocks.tensors[item.block_index].copy_(data)
            else:
                start = item.block_index * self.geometry.block_size + item.token_offset
                blocks.write_tokens(item.layer, start, data)

    def layer_items(self, request_id: str, layer: int, start: int, stop: int) -> list[TransferItem]:
        """Layer Blocks covering tokens ``[start, stop)`` of ``layer`` (payloads view the slots)."""
        tensors = self.blocks(request_id).tensors
        return [
            TransferItem(
                key=request_id,
                block_index=b,
                layer=layer,
                num_tokens=n,
                token_offset=off,
                payload=tensors[b][layer, off : off + n],
            )  # fmt: skip
            for b, off, n in layer_items_spans(start, stop, self.geometry.block_size)
        ]

    def send_layer(
        self, request_id: str, layer: int, start: int, stop: int, dest: str, transport: Transport
    ) -> TransferHandle:
        """Submit tokens ``[start, stop)`` of ``layer`` to ``dest`` as one batch of Layer Blocks."""
        items = self.layer_items(request_id, layer, start, stop)
        return transport.submit(dest, items, source=self.name)
