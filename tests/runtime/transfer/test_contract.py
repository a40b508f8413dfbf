"""The Transport contract (runtime/transfer/base.py) on every cross-process transport: zmq, shm,
mooncake, nixl (``kind``, conftest.py: skipped with the reason where an engine does not import)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from dualpath.runtime.transfer.auth import ClusterKeys
from dualpath.runtime.transfer.base import FULL_BLOCK, TransferError, TransferItem
from dualpath.runtime.transfer.control import Control, HitsLoaded, PrefillDone, PullLayer

Make = Callable[..., Any]


class Collect:
    def __init__(self) -> None:
        self.items: list[tuple[str, str, int, int, int, bytes]] = []
        self.log: list[object] = []  # item layers and control messages, in arrival order
        self.lock = threading.Lock()

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        with self.lock:
            for it in items:
                self.items.append(
                    (source, it.key, it.block_index, it.layer, it.token_offset, bytes(it.payload))
                )
                self.log.append(it.layer)


class CollectControl(Collect):
    def control(self, source: str, msgs: Sequence[Control]) -> None:
        with self.lock:
            self.log.extend(msgs)


class Fail:
    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        raise ValueError("sink refuses")


def _pair(make: Make, sink: object, **kw: Any) -> tuple[Any, Any]:
    a, b = make(**kw), make(**kw)
    b.bind("de0", sink)
    a.add_route("de0", b.address)
    return a, b


def test_batches_arrive_whole_in_submit_order_and_complete(make: Make) -> None:
    sink = Collect()
    a, b = _pair(make, sink)
    handles = []
    for i in range(50):
        t = torch.full((64, 24), i, dtype=torch.float32)
        items = [TransferItem(key="r", block_index=i, layer=L, num_tokens=64, payload=t) for L in range(3)]
        handles.append(a.submit("de0", items, source="pe0"))
    big = bytes(range(256)) * 4096  # 1 MiB in one item
    handles.append(
        a.submit(
            "de0", [TransferItem(key="big", block_index=0, layer=FULL_BLOCK, num_tokens=64, payload=big)]
        )
    )
    for h in handles:
        h.wait(20)
    assert all(h.done and h.error is None for h in handles)
    assert [(it[2], it[3]) for it in sink.items[:-1]] == [(i, L) for i in range(50) for L in range(3)]
    assert sink.items[0][0] == "pe0"
    assert torch.frombuffer(bytearray(sink.items[7][5]), dtype=torch.float32).eq(2.0).all()
    assert sink.items[-1][5] == big and sink.items[-1][3] == FULL_BLOCK
    assert handles[0].nbytes == 3 * 64 * 24 * 4 and handles[0].num_items == 3
    assert a.poll() == len(handles) and a.poll() == 0


def test_item_fields_dtypes_and_empty_payloads_survive(make: Make) -> None:
    sink = Collect()
    a, b = _pair(make, sink)
    bf16 = torch.randn(16, 8).to(torch.bfloat16)
    items = [
        TransferItem(key="req-1", block_index=3, layer=7, num_tokens=5, token_offset=11, payload=bf16),
        TransferItem(key="req-2", block_index=0, layer=0, num_tokens=0, payload=b""),
        TransferItem(key="req-3", block_index=9, layer=1, num_tokens=2, payload=bytearray(b"xy")),
    ]
    a.submit("de0", items, source="pe9").wait(20)
    assert [(s, k, bi, L, off) for s, k, bi, L, off, _ in sink.items] == [
        ("pe9", "req-1", 3, 7, 11), ("pe9", "req-2", 0, 0, 0), ("pe9", "req-3", 9, 1, 0)
    ]  # fmt: skip
    got = torch.frombuffer(bytearray(sink.items[0][5]), dtype=torch.bfloat16).view(16, 8)
    assert torch.equal(got, bf16) and sink.items[1][5] == b"" and sink.items[2][5] == b"xy"


def test_ring_wraps_and_a_batch_above_it_still_arrives(make: Make) -> None:
    sink = Collect()
    a, b = _pair(make, sink, ring_bytes=64 * 1024)
    handles = []
    for i in range(40):  # 40 x 3 x 6 KiB >> 64 KiB: a ring (shm, engines) wraps many times
        t = torch.full((64, 24), float(i))
        handles.append(
            a.submit(
                "de0",
                [TransferItem(key="r", block_index=i, layer=L, num_tokens=64, payload=t) for L in range(3)],
            )
        )
    huge = b"z" * (200 * 1024)  # larger than the ring: frames
    handles.append(
        a.submit("de0", [TransferItem(key="h", block_index=0, layer=FULL_BLOCK, num_tokens=1, payload=huge)])
    )
    for h in handles:
        h.wait(20)
    assert [(it[2], it[3]) for it in sink.items[:-1]] == [(i, L) for i in range(40) for L in range(3)]
    assert torch.all(torch.frombuffer(bytearray(sink.items[3 * 17][5]), dtype=torch.float32) == 17.0)
    assert sink.items[-1][5] == huge


def test_sink_error_fails_the_handle_and_unknown_endpoint_raises(make: Make) -> None:
    a, b = _pair(make, Fail())
    h = a.submit("de0", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1, payload=b"ab")])
    with pytest.raises(TransferError, match="sink refuses"):
        h.wait(20)
    with pytest.raises(TransferError, match="unknown endpoint"):
        a.submit("nowhere", [])
    with pytest.raises(TransferError, match="already bound"):
        b.bind("de0", Collect())


def test_transfers_to_a_dead_peer_fail_on_request_and_close_fails_the_rest(make: Make) -> None:
    a = make()
    a.add_route("gone", "tcp://127.0.0.1:9")  # nothing listens
    h = a.submit("gone", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1, payload=b"x")])
    assert not h.done
    assert a.fail_endpoint("gone", "engine died") == 1
    with pytest.raises(TransferError, match="engine died"):
        h.wait(1)
    late = a.submit("gone", [TransferItem(key="k", block_index=1, layer=0, num_tokens=1, payload=b"y")])
    a.close()
    with pytest.raises(TransferError, match="closed"):
        late.wait(1)
    with pytest.raises(TransferError, match="closed"):
        a.submit("gone", [])


def test_limiter_sees_every_byte_once_per_batch(make: Make) -> None:
    seen: list[int] = []
    a = make(limiter=seen.append)
    b = make()
    b.bind("d", Collect())
    a.add_route("d", b.address)
    a.submit("d", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1, payload=b"x" * 100)] * 2).wait(
        20
    )
    assert seen == [200]


@pytest.mark.parametrize("keyed", [False, True])
def test_control_messages_arrive_typed_after_the_kv_sent_before_them(make: Make, keyed: bool) -> None:
    """``notify`` shares the FIFO of ``submit`` (over CURVE too); a control message to a sink
    without ``control`` fails its handle and is counted."""
    keys = ClusterKeys.generate() if keyed else None
    sink = CollectControl()
    a, b = _pair(make, sink, keys=keys)
    b.bind("plain", Collect())
    a.add_route("plain", b.address)
    sent: list[object] = []
    handles = []
    for i in range(20):
        payload = torch.full((256,), float(i))  # 1 KiB: the one-sided engines' slots, not frames
        handles.append(
            a.submit(
                "de0", [TransferItem(key="r", block_index=0, layer=i % 3, num_tokens=1, payload=payload)]
            )
        )
        sent.append(i % 3)
        msg = [PullLayer(key="r", layer=i, start=0, stop=i), HitsLoaded(key="r", end_tokens=64 * i),
               PrefillDone(key="r", first_token=i)][i % 3]  # fmt: skip
        handles.append(a.notify("de0", [msg], source="pe0"))
        sent.append(msg)
    for h in handles:
        h.wait(20)
    assert sink.log == sent and all(h.error is None for h in handles)
    refused = a.notify("plain", [PrefillDone(key="r", first_token=1)])
    with pytest.raises(TransferError, match="takes no control messages"):
        refused.wait(20)
    assert b.drops.snapshot().get("data/no_control_sink") == 1
    with pytest.raises(TransferError, match="control messages"):
        a.notify("de0", [])


def test_a_peer_without_the_cluster_key_cannot_deliver(make: Make) -> None:
    keys = ClusterKeys.generate()
    sink = Collect()
    b = make(keys=keys)
    b.bind("de0", sink)
    outsider = make()
    outsider.add_route("de0", b.address)
    h = outsider.submit(
        "de0", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1, payload=b"x" * 64)]
    )
    with pytest.raises(TransferError, match="timed out"):
        h.wait(1.5)
    assert sink.items == []
    for _ in range(100):
        if b.drops.snapshot().get("data/unauthenticated", 0) >= 1:
            break
        threading.Event().wait(0.02)
    assert b.drops.snapshot().get("data/unauthenticated", 0) >= 1


def test_payloads_inside_a_registered_buffer_arrive_in_order(make: Make) -> None:
    """``register`` (an engine's KV pool, once): slices of it sent, many batches in flight, arrive
    whole and in order on every transport (the one-sided engines read them in place)."""
    sink = Collect()
    a, b = _pair(make, sink)
    pool = torch.arange(64 * 1024, dtype=torch.int32).view(64, 1024)  # 64 blocks of 4 KiB
    n = a.register(pool)
    assert n in (0, pool.nbytes)  # 0: a transport without registered memory
    handles = [
        a.submit(
            "de0",
            [
                TransferItem(key="r", block_index=i + j, layer=0, num_tokens=1, payload=pool[i + j])
                for j in range(4)
            ],
        )  # fmt: skip
        for i in range(0, 64, 4)
    ]
    for h in handles:
        h.wait(20)
    assert [it[2] for it in sink.items] == list(range(64))
    assert all(it[5] == pool[it[2]].numpy().tobytes() for it in sink.items)
