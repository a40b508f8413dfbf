from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

from dualpath.runtime.transfer import (
    FULL_BLOCK,
    InProcFabric,
    TransferError,
    TransferHandle,
    TransferItem,
)


class RecordingSink:
    def __init__(self) -> None:
        self.got: list[tuple[str, TransferItem, bytes]] = []

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        for it in items:
            p = it.payload
            raw = p.numpy().tobytes() if isinstance(p, torch.Tensor) else bytes(p)
            self.got.append((source, it, raw))


class FailingSink:
    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        raise RuntimeError("disk full")


def _item(i: int, payload: object, layer: int = 0) -> TransferItem:
    return TransferItem(key="r1", block_index=i, layer=layer, num_tokens=4, payload=payload)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_batch_delivered_in_order_and_handle_completes(asynchronous: bool) -> None:
    fabric = InProcFabric()
    sink = RecordingSink()
    tx = fabric.transport(asynchronous=asynchronous)
    tx.bind("de0", sink)
    seen: list[TransferHandle] = []
    items = [_item(i, torch.full((8,), i, dtype=torch.uint8)) for i in range(5)]
    h = tx.submit("de0", items, source="pe0", callback=seen.append)
    h2 = tx.submit_one("de0", "r1", 9, FULL_BLOCK, b"\x07" * 3, 2)
    h.wait(5.0)
    h2.wait(5.0)
    assert h.done and h.error is None and seen == [h]
    assert h.num_items == 5 and h.nbytes == 40
    assert [it.block_index for _, it, _ in sink.got] == [0, 1, 2, 3, 4, 9]
    assert sink.got[2][2] == bytes([2] * 8) and sink.got[0][0] == "pe0"
    assert sink.got[5][1].layer == FULL_BLOCK and sink.got[5][2] == b"\x07" * 3
    tx.close()


def test_unknown_endpoint_and_sink_error_fail_the_handle() -> None:
    fabric = InProcFabric()
    tx = fabric.transport()
    tx.bind("bad", FailingSink())
    h = tx.submit("nowhere", [_item(0, b"x")])
    with pytest.raises(TransferError, match="unknown endpoint 'nowhere'"):
        h.wait(1.0)
    h = tx.submit("bad", [_item(0, b"x")])
    assert h.done and isinstance(h.error, RuntimeError)
    with pytest.raises(TransferError, match="disk full"):
        h.wait(1.0)
    assert tx.poll() == 2 and tx.poll() == 0


def test_double_bind_and_closed_transport_raise() -> None:
    fabric = InProcFabric()
    tx = fabric.transport(asynchronous=True)
    tx.bind("a", RecordingSink())
    with pytest.raises(TransferError, match="already bound"):
        fabric.transport().bind("a", RecordingSink())
    tx.close()
    with pytest.raises(TransferError, match="closed"):
        tx.submit("a", [_item(0, b"x")])


def test_wait_times_out_when_never_delivered() -> None:
    block = threading.Event()

    class SlowSink:
        def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
            block.wait(5.0)

    fabric = InProcFabric()
    tx = fabric.transport(asynchronous=True)
    tx.bind("slow", SlowSink())
    h = tx.submit("slow", [_item(0, b"x")])
    with pytest.raises(TransferError, match="timed out"):
        h.wait(0.05)
    block.set()
    h.wait(5.0)
    tx.close()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_control_messages_keep_the_fifo_and_need_a_control_sink(asynchronous: bool) -> None:
    from dualpath.runtime.transfer import PrefillDone, PullLayer

    class Both:
        def __init__(self) -> None:
            self.log: list[object] = []

        def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
            self.log.extend(it.block_index for it in items)

        def control(self, source: str, msgs: Sequence[object]) -> None:
            self.log.extend(msgs)

    fabric = InProcFabric()
    t = fabric.transport(asynchronous=asynchronous)
    sink = Both()
    t.bind("de0", sink)
    t.bind("kv-only", RecordingSink())
    pull, done = PullLayer(key="r1", layer=0, start=0, stop=4), PrefillDone(key="r1", first_token=7)
    hs = [
        t.submit("de0", [_item(0, b"a")]),
        t.notify("de0", [pull]),
        t.submit("de0", [_item(1, b"b")]),
        t.notify("de0", [done]),
    ]
    for h in hs:
        h.wait(5)
    assert sink.log == [0, pull, 1, done]
    with pytest.raises(TransferError, match="takes no control messages"):
        t.notify("kv-only", [done]).wait(5)
    t.close()
