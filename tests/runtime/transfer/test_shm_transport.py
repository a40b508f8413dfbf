from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from dualpath.runtime.transfer.base import TransferItem
from dualpath.runtime.transfer.shm_transport import ShmTransport, _Ring


class Collect:
    def __init__(self) -> None:
        self.items: list[tuple[str, int, int, bytes]] = []
        self.lock = threading.Lock()

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        with self.lock:
            for it in items:
                self.items.append((it.key, it.block_index, it.layer, bytes(it.payload)))


def test_ring_reuses_space_in_fifo_order() -> None:
    ring = _Ring(100)
    try:
        a = ring.alloc(40)
        b = ring.alloc(40)
        assert (a, b) == (0, 40)
        ring.free(a)
        c = ring.alloc(30)  # does not fit at the end (80+30 > 100): wraps to 0, before b
        assert c == 0
        ring.free(b)
        ring.free(c)
        assert ring.alloc(100) == 0
    finally:
        ring.close()


def test_round_trip_through_shared_memory_with_ring_wrap() -> None:
    a, b = ShmTransport(ring_bytes=64 * 1024), ShmTransport(ring_bytes=64 * 1024)
    try:
        sink = Collect()
        b.bind("de0", sink)
        a.add_route("de0", b.address)
        handles = []
        for i in range(40):  # 40 x 3 x 6 KiB >> 64 KiB ring: the ring wraps many times
            t = torch.full((64, 24), float(i))
            handles.append(
                a.submit(
                    "de0",
                    [
                        TransferItem(key="r", block_index=i, layer=L, num_tokens=64, payload=t)
                        for L in range(3)
                    ],
                )
            )
        huge = b"z" * (200 * 1024)  # larger than the ring: falls back to frames
        handles.append(
            a.submit("de0", [TransferItem(key="h", block_index=0, layer=-1, num_tokens=1, payload=huge)])
        )
        for h in handles:
            h.wait(10)
        assert [(it[1], it[2]) for it in sink.items[:-1]] == [(i, L) for i in range(40) for L in range(3)]
        got = torch.frombuffer(bytearray(sink.items[3 * 17][3]), dtype=torch.float32)
        assert torch.all(got == 17.0)
        assert sink.items[-1][3] == huge
    finally:
        a.close()
        b.close()
