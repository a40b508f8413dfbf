from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

from dualpath.runtime.transfer.base import TransferError, TransferItem
from dualpath.runtime.transfer.zmq_transport import ZmqTransport


class Collect:
    def __init__(self) -> None:
        self.items: list[tuple[str, str, int, int, bytes]] = []
        self.lock = threading.Lock()

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        with self.lock:
            for it in items:
                self.items.append((source, it.key, it.block_index, it.layer, bytes(it.payload)))


class Fail:
    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        raise ValueError("sink refuses")


@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_round_trip_order_and_completion(scheme: str) -> None:
    a, b = ZmqTransport(scheme=scheme), ZmqTransport(scheme=scheme)
    try:
        sink = Collect()
        b.bind("de0", sink)
        a.add_route("de0", b.address)
        handles = []
        for i in range(50):
            t = torch.full((64, 24), i, dtype=torch.float32)
            items = [TransferItem(key="r", block_index=i, layer=L, num_tokens=64, payload=t)
                     for L in range(3)]
            handles.append(a.submit("de0", items, source="pe0"))
        big = bytes(range(256)) * 4096  # 1 MiB, zero-copy frame
        handles.append(a.submit("de0", [TransferItem(key="big", block_index=0, layer=-1,
                                                      num_tokens=64, payload=big)]))
        for h in handles:
            h.wait(10)
        assert all(h.done and h.error is None for h in handles)
        assert [(it[2], it[3]) for it in sink.items[:-1]] == [(i, L) for i in range(50) for L in range(3)]
        assert sink.items[0][0] == "pe0"
        assert torch.frombuffer(bytearray(sink.items[7][4]), dtype=torch.float32)[0].item() == 2.0
        assert sink.items[-1][4] == big
        assert a.poll() == len(handles)
    finally:
        a.close()
        b.close()


def test_sink_error_fails_handle_and_unknown_endpoint() -> None:
    a, b = ZmqTransport(), ZmqTransport()
    try:
        b.bind("x", Fail())
        a.add_route("x", b.address)
        h = a.submit("x", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1, payload=b"ab")])
        with pytest.raises(TransferError, match="sink refuses"):
            h.wait(10)
        with pytest.raises(TransferError, match="unknown endpoint"):
            a.submit("nowhere", [])
    finally:
        a.close()
        b.close()


def test_dead_peer_transfers_fail_on_request() -> None:
    a = ZmqTransport()
    try:
        a.add_route("gone", "tcp://127.0.0.1:9")  # nothing listens
        h = a.submit("gone", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1,
                                            payload=b"x")])
        assert not h.done
        assert a.fail_endpoint("gone", "engine died") == 1
        with pytest.raises(TransferError, match="engine died"):
            h.wait(1)
    finally:
        a.close()


def test_limiter_sees_every_byte() -> None:
    seen: list[int] = []
    a, b = ZmqTransport(limiter=seen.append), ZmqTransport()
    try:
        b.bind("d", Collect())
        a.add_route("d", b.address)
        a.submit("d", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1,
                                    payload=b"x" * 100)] * 2).wait(10)
        assert seen == [200]
    finally:
        a.close()
        b.close()


def test_factory_names() -> None:
    from dualpath.core.errors import ConfigError
    from dualpath.runtime.transfer.factory import make_transport

    t = make_transport("zmq")
    assert t.address.startswith("tcp://")  # type: ignore[attr-defined]
    t.close()
    with pytest.raises(ConfigError, match="transport"):
        make_transport("carrier-pigeon")
    with pytest.raises(ConfigError, match="nixl"):
        make_transport("nixl")
