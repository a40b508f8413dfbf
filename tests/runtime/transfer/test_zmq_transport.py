from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from dualpath.runtime.transfer.base import TransferItem
from dualpath.runtime.transfer.control import Control
from dualpath.runtime.transfer.zmq_transport import ZmqTransport


class Collect:
    def __init__(self) -> None:
        self.items: list[tuple[str, str, int, int, bytes]] = []
        self.lock = threading.Lock()

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        with self.lock:
            for it in items:
                self.items.append((source, it.key, it.block_index, it.layer, bytes(it.payload)))


def test_ipc_scheme_round_trip() -> None:
    """The ipc:// flavour (a socket file) under the shared contract's tests (test_contract.py)."""
    a, b = ZmqTransport(scheme="ipc"), ZmqTransport(scheme="ipc")
    try:
        sink = Collect()
        b.bind("de0", sink)
        a.add_route("de0", b.address)
        assert b.address.startswith("ipc://")
        items = [
            TransferItem(key="r", block_index=i, layer=0, num_tokens=1, payload=bytes([i]) * 8)
            for i in range(5)
        ]
        a.submit("de0", items, source="pe0").wait(10)
        assert [it[2] for it in sink.items] == list(range(5)) and sink.items[4][4] == b"\x04" * 8
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


class CollectControl(Collect):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[object] = []  # items and control messages, in arrival order

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        super().deliver(source, items)
        self.log.extend(it.layer for it in items)

    def control(self, source: str, msgs: Sequence[Control]) -> None:
        self.log.extend(msgs)


def test_marker_layers_and_bad_control_fields_are_dropped_at_decode() -> None:
    import msgspec
    import zmq

    from dualpath.runtime.transfer.zmq_wire import DataMsg, ItemMeta

    b = ZmqTransport()
    try:
        sink = CollectControl()
        b.bind("de0", sink)
        push = b.ctx.socket(zmq.PUSH)
        push.connect(b.address)
        push.send_multipart(
            [
                msgspec.msgpack.encode(
                    DataMsg(1, "tcp://127.0.0.1:9", "de0", "x", [ItemMeta("k", -1, -3, 1, 0, 4)])
                ),
                b"abcd",
            ]
        )
        push.send(
            msgspec.msgpack.encode(
                ["c", 2, "tcp://127.0.0.1:9", "de0", "x", [{"t": "HitsLoaded", "key": "", "end_tokens": 3}]]
            )
        )
        push.send(
            msgspec.msgpack.encode(
                [
                    "c",
                    3,
                    "tcp://127.0.0.1:9",
                    "de0",
                    "x",
                    [{"t": "PullLayer", "key": "k", "layer": -1, "start": 0, "stop": 1}],
                ]
            )
        )
        for _ in range(200):
            if b.drops.snapshot().get("data/invalid", 0) >= 3:
                break
            threading.Event().wait(0.02)
        push.close(0)
        assert b.drops.snapshot().get("data/invalid") == 3 and sink.log == []
    finally:
        b.close()
