"""The one-sided engines' registered memory (mooncake, nixl): payloads inside a registered KV
buffer go in place, others through the ring, in one batch; a read whose engine cannot confirm it
is over never has its landing range handed out again (the next reads land in a fresh generation)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

from dualpath.runtime.transfer.base import TransferError, TransferItem
from dualpath.runtime.transfer.regions import Regions, UnsettledRead


class Collect:
    def __init__(self) -> None:
        self.items: list[bytes] = []
        self.lock = threading.Lock()

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        with self.lock:
            self.items.extend(bytes(memoryview(it.payload).cast("B")) for it in items)


def _make(engine: str) -> Any:
    from dualpath.runtime.transfer.factory import make_transport, missing

    if (why := missing(engine)) is not None:
        pytest.skip(f"transport {engine} not importable here: {why}")
    return make_transport(engine)


def _item(i: int, payload: Any) -> TransferItem:
    return TransferItem(key="r", block_index=i, layer=0, num_tokens=4, payload=payload)


def test_regions_find_only_payloads_wholly_inside_one_registration() -> None:
    seen: list[tuple[int, int]] = []
    regions = Regions(lambda a, n: seen.append((a, n)))
    buf = torch.zeros(4096, dtype=torch.uint8)
    assert regions.add(buf) == 4096 and regions.add(buf[1024:]) == 0  # covered: not again
    base = buf.data_ptr()
    assert seen == [(base, 4096)]
    assert regions.inside(base + 100, 200) == base + 100
    assert regions.inside(base + 4000, 200) is None and regions.inside(base - 1, 2) is None
    with pytest.raises(TransferError, match="contiguous CPU"):
        regions.add(torch.zeros(8, 8)[:, 0])


@pytest.mark.parametrize("engine", ["mooncake", "nixl"])
def test_registered_payloads_go_in_place_mixed_with_ring_ones(engine: str) -> None:
    a, b = _make(engine), _make(engine)
    try:
        sink = Collect()
        b.bind("de0", sink)
        a.add_route("de0", b.address)
        arena = torch.from_numpy(np.random.default_rng(1).integers(0, 255, 8192, dtype=np.uint8))
        assert a.register(arena) == 8192
        other = bytes(range(256)) * 4  # not registered: copied into the ring
        items = [_item(0, arena[:4096]), _item(1, other), _item(2, arena[4096:].numpy())]
        a.submit("de0", items).wait(30)
        assert sink.items == [arena[:4096].numpy().tobytes(), other, arena[4096:].numpy().tobytes()]
        assert a.in_place_bytes == 8192
    finally:
        a.close()
        b.close()


class _Unsettling:
    """A real engine whose first ``wait`` succeeds at the engine but reports the read unsettled."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.failed = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def wait(self, token: Any) -> None:
        self.inner.wait(token)
        if not self.failed:
            self.failed += 1
            raise UnsettledRead("injected: the engine could not cancel this read")


@pytest.mark.parametrize("engine", ["mooncake", "nixl"])
def test_an_unsettled_read_retires_its_landing_generation(engine: str) -> None:
    a, b = _make(engine), _make(engine)
    try:
        sink = Collect()
        b.bind("de0", sink)
        b.engine = _Unsettling(b.engine)
        a.add_route("de0", b.address)
        first = b._landing
        with pytest.raises(TransferError, match="could not cancel"):
            a.submit("de0", [_item(0, b"x" * 1000)]).wait(30)
        a.submit("de0", [_item(1, b"y" * 1000)]).wait(30)
        assert sink.items == [b"y" * 1000]
        assert b._retired == [first] and b._landing is not first and b._landing.gen == 1
        assert first.ranges._live and not first.ranges._live[0][2]  # its range stays allocated
    finally:
        a.close()
        b.close()
