"""The one-sided engines' own parts (mooncake, nixl): what a forged slot header gets, and the
coalescing of adjacent slots. Their contract is test_contract.py's."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
import zmq

from dualpath.runtime.transfer.base import TransferItem
from dualpath.runtime.transfer.onesided import coalesce
from dualpath.runtime.transfer.zmq_wire import DECODER, AckMsg, DataMsg, ItemMeta


class Collect:
    def __init__(self) -> None:
        self.items: list[bytes] = []

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        self.items.extend(bytes(it.payload) for it in items)


def test_coalesce_merges_only_spans_adjacent_on_both_sides() -> None:
    spans = [(100, 1000, 10), (110, 1010, 5), (115, 2000, 5), (120, 2005, 0), (120, 2005, 3)]
    assert coalesce(spans) == [(100, 1000, 15), (115, 2000, 8)]
    assert coalesce([(0, 0, 0)]) == []


def _ack(pull: zmq.Socket) -> AckMsg:
    assert pull.poll(20_000), "no ack within 20 s"
    msg = DECODER.decode(pull.recv())
    assert isinstance(msg, AckMsg)
    return msg


@pytest.mark.parametrize("engine", ["mooncake", "nixl"])
def test_forged_slot_headers_fail_alone(engine: str) -> None:
    """Slots outside the sender's registered memory, or a segment that names no peer of this
    engine, get an error ack (the latter counted as a drop); the receiver goes on delivering."""
    from dualpath.runtime.transfer.factory import missing

    if (why := missing(engine)) is not None:
        pytest.skip(f"transport {engine} not importable here: {why}")
    from dualpath.runtime.transfer.factory import make_transport

    a, b = make_transport(engine), make_transport(engine)
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        sink = Collect()
        b.bind("de0", sink)
        a.add_route("de0", b.address)
        pull.bind("tcp://127.0.0.1:*")
        me = pull.getsockopt_string(zmq.LAST_ENDPOINT)
        push.connect(b.address)
        past_ring = a._send_addr + a.ring_bytes  # just past the sender's registered ring
        seg, peer = a.engine.segment, a.engine.peer_info
        push.send(
            msgspec.msgpack.encode(
                DataMsg(1, me, "de0", "x", [ItemMeta("k", 0, 0, 1, 0, 4096, past_ring)], seg, peer)
            )
        )
        assert _ack(pull).error is not None
        push.send(
            msgspec.msgpack.encode(
                DataMsg(2, me, "de0", "x", [ItemMeta("k", 0, 0, 1, 0, 8, 64)], "bogus", b"")
            )
        )
        bad = _ack(pull)
        assert bad.error is not None and "refused" in bad.error
        assert b.drops.snapshot().get("data/bad_frames") == 1
        a.submit(
            "de0", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1, payload=b"ok" * 512)]
        ).wait(20)
        assert sink.items == [b"ok" * 512]
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()
        a.close()
        b.close()


EXIT_SCRIPT = """
import sys
from dualpath.runtime.transfer.base import TransferItem
from dualpath.runtime.transfer.factory import make_transport

class Sink:
    def deliver(self, source, items):
        pass

a, b = make_transport(sys.argv[1]), make_transport(sys.argv[1])
b.bind("d", Sink())
a.add_route("d", b.address)
a.submit("d", [TransferItem(key="k", block_index=0, layer=0, num_tokens=1, payload=b"x" * 4096)]).wait(20)
a.close()
b.close()
"""


@pytest.mark.parametrize("engine", ["mooncake", "nixl"])
def test_a_process_that_used_the_engine_exits_cleanly(engine: str) -> None:
    """(nixl-cu12 1.5.1 with UCX's ib modules loaded segfaults at exit, in its bundled libnl-route:
    nixl.py keeps them out on a host without RDMA devices.)"""
    import os
    import subprocess
    import sys

    from dualpath.runtime.transfer.factory import missing

    if (why := missing(engine)) is not None:
        pytest.skip(f"transport {engine} not importable here: {why}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, engine], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
