"""One step's layerwise reads of store hits (threads and numpy only; no vLLM, no torch).

A thread reads, layer by layer, every hit block's Layer Block of that layer into ``bufs[layer]``
and then sets ``ready[layer]``; the connector copies layer ``i`` into vLLM's paged cache once
``ready[i]`` is set, while the thread reads layer ``i + 1``. A block that fails to read (absent,
vanished, checksum) ends its request's good prefix: it and every later block are a miss from then
on (``good[i]`` leading blocks of load ``i`` were read intact in every layer). With a storage-NIC
limiter each read books its bytes and waits for its slot (``dualpath serve``'s emulated links).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from dualpath.runtime.kvstore import BandwidthLimiter, BlockStore
from dualpath.runtime.kvstore.bandwidth import wait_until


class LoadJob:
    """Reads ``hashes_per_load`` (one chain of store blocks per request) layer by layer."""

    def __init__(self, store: BlockStore, hashes_per_load: Sequence[Sequence[str]], *,
                 limiter: BandwidthLimiter | None = None) -> None:  # fmt: skip
        self.store, self.hashes, self.limiter = store, [list(h) for h in hashes_per_load], limiter
        self.num_blocks = [len(h) for h in self.hashes]
        self.good = list(self.num_blocks)
        self.read_bytes = 0
        num_layers, nbytes = store.layout.num_layers, store.layout.layer_block_bytes
        self.bufs = [[np.empty((n, nbytes), dtype=np.uint8) for n in self.num_blocks]
                     for _ in range(num_layers)]  # fmt: skip
        self.ready = [threading.Event() for _ in range(num_layers)]
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, name="dualpath-kv-load", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for layer, event in enumerate(self.ready):
                self._read_layer(layer)
                event.set()
        except Exception as exc:  # every block a miss (``error``); never leave a layer waiting forever
            self.error = exc
            for i in range(len(self.good)):
                self.good[i] = 0
            for event in self.ready:
                event.set()

    def _read_layer(self, layer: int) -> None:
        nbytes = self.store.layout.layer_block_bytes
        for i, hashes in enumerate(self.hashes):
            for j in range(self.good[i]):
                if not self.store.read_layer_into(hashes[j], layer, self.bufs[layer][i][j]):
                    self.good[i] = j  # this block and every later one are a miss
                    break
                self.read_bytes += nbytes
                if self.limiter is not None:
                    wait_until(self.limiter.reserve(nbytes))

    def wait(self, layer: int) -> list[np.ndarray]:
        """Block until ``layer`` is read; per load, its intact leading blocks of that layer."""
        self.ready[layer].wait()
        return [self.bufs[layer][i][: self.good[i]] for i in range(len(self.hashes))]

    def release(self, layer: int) -> None:
        """Drop ``layer``'s buffers once copied."""
        self.bufs[layer] = [b[:0] for b in self.bufs[layer]]

    def finish(self) -> list[int]:
        """Wait for the thread; per load, how many leading blocks were read intact in every layer."""
        for event in self.ready:
            event.wait()
        self.thread.join()
        return list(self.good)
