from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

from dualpath.runtime.transfer.auth import ClusterKeys
from dualpath.runtime.transfer.base import TransferError, TransferItem
from dualpath.runtime.transfer.control import Control, HitsLoaded, PrefillDone, PullLayer
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
            items = [
                TransferItem(key="r", block_index=i, layer=L, num_tokens=64, payload=t) for L in range(3)
            ]
            handles.append(a.submit("de0", items, source="pe0"))
        big = bytes(range(256)) * 4096  # 1 MiB, zero-copy frame
        handles.append(
            a.submit("de0", [TransferItem(key="big", block_index=0, layer=-1, num_tokens=64, payload=big)])
        )
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
        h = a.submit("gone", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1, payload=b"x")])
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
        a.submit(
            "d", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1, payload=b"x" * 100)] * 2
        ).wait(10)
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


class CollectControl(Collect):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[object] = []  # items and control messages, in arrival order

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        super().deliver(source, items)
        self.log.extend(it.layer for it in items)

    def control(self, source: str, msgs: Sequence[Control]) -> None:
        self.log.extend(msgs)


@pytest.mark.parametrize("keyed", [False, True])
def test_control_messages_arrive_typed_after_the_kv_sent_before_them(keyed: bool) -> None:
    """``notify`` shares the FIFO of ``submit``; the receiver gets the typed Structs back (over
    CURVE too); a control message to a sink without ``control`` fails its handle, counted."""
    keys = ClusterKeys.generate() if keyed else None
    a, b = ZmqTransport(keys=keys), ZmqTransport(keys=keys)
    try:
        sink = CollectControl()
        b.bind("de0", sink)
        b.bind("plain", Collect())
        a.add_route("de0", b.address)
        a.add_route("plain", b.address)
        sent: list[object] = []
        handles = []
        for i in range(20):
            handles.append(
                a.submit(
                    "de0",
                    [TransferItem(key="r", block_index=0, layer=i % 3, num_tokens=1, payload=b"x" * 16)],
                )
            )
            sent.append(i % 3)
            msg = [
                PullLayer(key="r", layer=i, start=0, stop=i),
                HitsLoaded(key="r", end_tokens=64 * i),
                PrefillDone(key="r", first_token=i),
            ][i % 3]
            handles.append(a.notify("de0", [msg], source="pe0"))
            sent.append(msg)
        for h in handles:
            h.wait(10)
        assert sink.log == sent and all(h.error is None for h in handles)
        refused = a.notify("plain", [PrefillDone(key="r", first_token=1)])
        with pytest.raises(TransferError, match="takes no control messages"):
            refused.wait(10)
        assert b.drops.snapshot().get("data/no_control_sink") == 1
        with pytest.raises(TransferError, match="control messages"):
            a.notify("de0", [])
    finally:
        a.close()
        b.close()


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
