"""The prefill device's layer staging area: the only place cached KV lives on the prefill device.

``num_slots`` (2: the layer being computed and the next one being loaded) preallocated tensors of
``[max_cached_tokens, 2, kv_heads, head_dim]``. Before loading layer ``i`` the engine lays the batch's
requests out in slot ``i % num_slots`` (``arrange``); loads land there either by a local copy from the
PE buffer (PE read path) or through the transport (DE read path: this object is the PE endpoint's
``KVSink``). So at most ``num_slots`` layers of cached KV are resident at once, bounded in bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from dualpath.core.errors import ConfigError
from dualpath.runtime.engine.kvbuffer import payload_tensor
from dualpath.runtime.engine.types import KVGeometry
from dualpath.runtime.transfer import FULL_BLOCK, TransferItem


class LayerStaging:
    """Double-buffered per-layer KV staging (see module docstring)."""

    def __init__(
        self, geometry: KVGeometry, max_cached_tokens: int, device: torch.device, num_slots: int = 2
    ) -> None:
        self.geometry = geometry
        self.max_cached_tokens = max_cached_tokens
        self.num_slots = num_slots
        shape = (num_slots, max(max_cached_tokens, 1), *geometry.token_shape)
        self._buf = torch.zeros(shape, dtype=geometry.dtype, device=device)  # touched once, here
        self._offsets: list[dict[str, tuple[int, int, int]]] = [{} for _ in range(num_slots)]
        self._lock = threading.Lock()
        # CUDA: loads run on a side stream so they overlap compute; events order the two
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._events: list[torch.cuda.Event | None] = [None] * num_slots

    @contextmanager
    def loading(self, layer: int) -> Iterator[None]:
        """Context for the copies that fill ``layer``'s slot (a side CUDA stream on a GPU)."""
        if self._stream is None:
            yield
            return
        # the slot was last read by layer - num_slots, enqueued earlier on the compute stream
        self._stream.wait_stream(torch.cuda.default_stream(self._buf.device))
        with torch.cuda.stream(self._stream):
            yield
        self._events[layer % self.num_slots] = self._stream.record_event()

    def wait_loaded(self, layer: int) -> None:
        """Make the compute stream wait for ``layer``'s load (no-op on the CPU)."""
        event = self._events[layer % self.num_slots]
        if event is not None:
            torch.cuda.default_stream(self._buf.device).wait_event(event)

    @property
    def nbytes(self) -> int:
        return self._buf.numel() * self._buf.element_size()

    def arrange(self, layer: int, cached: Sequence[tuple[str, int, int]]) -> None:
        """Reserve, in layer ``layer``'s slot, room for each ``(request_id, cached_len, new_len)``:
        ``cached_len + new_len`` tokens rounded up to whole blocks."""
        padded = [self.geometry.padded_len(c + n) for _, c, n in cached]  # room for the new KV
        total = sum(padded)
        if total > self.max_cached_tokens:
            raise ConfigError("batch staging tokens (cached + new, block-padded)", total,
                              f"exceeds the staging capacity max_cached_tokens={self.max_cached_tokens}")  # fmt: skip
        offsets, base = {}, 0
        for (rid, c, n), size in zip(cached, padded, strict=True):
            offsets[rid] = (base, c, n)
            base += size
        with self._lock:
            self._offsets[layer % self.num_slots] = {f"{rid}@{layer}": v for rid, v in offsets.items()}

    def view(self, layer: int, request_id: str) -> torch.Tensor:
        """The request's cached KV of ``layer``: ``[cached_len, 2, kv, d]`` (a view, valid until reuse)."""
        base, c, _ = self._offsets[layer % self.num_slots][f"{request_id}@{layer}"]
        return self._buf[layer % self.num_slots, base : base + c]

    def work_view(self, layer: int, request_id: str) -> torch.Tensor:
        """``view`` plus room for the request's new tokens (``[cached_len + new_len, 2, kv, d]``), for
        ``Decoder.run_layer(..., cache_has_room=True)``."""
        base, c, n = self._offsets[layer % self.num_slots][f"{request_id}@{layer}"]
        return self._buf[layer % self.num_slots, base : base + c + n]

    def padded_view(self, layer: int, request_id: str) -> torch.Tensor:
        """``view`` extended to whole blocks (``ceil(cached_len / block_size) * block_size`` tokens)."""
        base, c, _ = self._offsets[layer % self.num_slots][f"{request_id}@{layer}"]
        return self._buf[layer % self.num_slots, base : base + self.geometry.padded_len(c)]

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        """KVSink: Layer Blocks of an arranged ``(request, layer)`` land at their token positions."""
        bs = self.geometry.block_size
        for item in items:
            if item.layer == FULL_BLOCK:
                raise ConfigError("layer", item.layer, "the prefill staging area takes Layer Blocks only")
            dst = self.view(item.layer, item.key)
            start = item.block_index * bs + item.token_offset
            if start + item.num_tokens > dst.shape[0]:
                raise ConfigError("num_tokens", start + item.num_tokens,
                                  f"beyond the {dst.shape[0]} arranged tokens of {item.key!r}")  # fmt: skip
            dst[start : start + item.num_tokens].copy_(payload_tensor(item, self.geometry))
