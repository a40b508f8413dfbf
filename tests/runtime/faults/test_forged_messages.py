"""Issue 13, messages: a peer without the cluster key cannot connect to the scheduler or a data
port (its handshakes are refused and counted); garbage and forged control- and data-plane messages
from an insider holding the key are dropped and counted (``dualpath_messages_dropped_total``); no
thread dies, no request stalls or fails because of them, and a normal request right after
succeeds."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest
import zmq

from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.messages import EngineHello, Heartbeat, Progress, Query, Submit, encode
from dualpath.runtime.transfer import HitsLoaded
from dualpath.runtime.transfer.zmq_wire import CtlMsg, DataMsg, ItemMeta

DROPPED = "dualpath_messages_dropped_total"


def _to_scheduler(rig, *frames: bytes, keyed: bool = True) -> None:
    s = rig.sock(zmq.DEALER, rig.cluster.address, keyed=keyed)
    s.send_multipart(list(frames))
    time.sleep(0.3)
    s.close(0)


def _to_data_port(rig, role: str, *frames: bytes, keyed: bool = True) -> None:
    s = rig.sock(zmq.PUSH, rig.data_addr(role), keyed=keyed)
    s.send_multipart(list(frames))
    time.sleep(0.3)
    s.close(0)


@pytest.mark.parametrize("role", ["scheduler", "decode", "prefill"])
def test_a_peer_without_the_key_cannot_connect(rig, role: str) -> None:
    """A well-formed Submit (scheduler) or KV message (data port) from a socket without the cluster
    key never arrives: the handshake is refused and counted, nothing is served or delivered."""
    plane = "control" if role == "scheduler" else "data"
    before = rig.metric(DROPPED, plane=plane, cause="unauthenticated")
    served = rig.metric("dualpath_cluster_requests_total")
    if role == "scheduler":
        _to_scheduler(
            rig,
            b"",
            encode(
                Submit(request_id="intruder", prompt_token_ids=[5, 6, 7], params=SamplingParams(max_tokens=2))
            ),
            keyed=False,
        )
    else:
        _to_data_port(
            rig, role, msgspec.msgpack.encode(DataMsg(1, "tcp://127.0.0.1:9", "e1", "e0", [])), keyed=False
        )
    assert rig.wait_metric(DROPPED, before, plane=plane, cause="unauthenticated") > before
    assert rig.metric("dualpath_cluster_requests_total") == served  # the Submit never arrived
    rig.assert_serving()


def test_a_client_with_another_key_is_refused(rig) -> None:
    from dualpath.runtime.transfer.auth import ClusterKeys

    before = rig.metric(DROPPED, plane="control", cause="unauthenticated")
    other = ClusterKeys.generate()
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.curve_serverkey = rig.cluster.keys.public  # knows the (public) server key, not the secret
    s.curve_publickey, s.curve_secretkey = other.public, other.secret
    s.connect(rig.cluster.address)
    s.send_multipart([b"", encode(Query(query_id=1, what="health"))])
    assert not s.poll(1000)  # no answer
    s.close(0)
    assert rig.wait_metric(DROPPED, before, plane="control", cause="unauthenticated") > before


def _foo_hello() -> bytes:
    return encode(
        EngineHello(
            engine_id=-1,
            role="foo",
            node_id=0,
            data_addr="tcp://127.0.0.1:9",  # type: ignore[arg-type]
            pid=1,
            hbm_tokens=0,
        )
    )


@pytest.mark.parametrize(
    ("label", "send", "plane", "cause"),
    [
        (
            "garbage bytes to the scheduler",
            lambda r: _to_scheduler(r, b"\xc1\xff garbage"),
            "control",
            "undecodable",
        ),
        (
            "malformed msgspec message to the scheduler",
            lambda r: _to_scheduler(r, b"", msgspec.msgpack.encode({"t": "Submit", "request_id": 5})),
            "control",
            "invalid",
        ),
        ("EngineHello(role='foo')", lambda r: _to_scheduler(r, _foo_hello()), "control", "invalid"),
        (
            "heartbeat of an unknown engine",
            lambda r: _to_scheduler(
                r,
                encode(
                    Heartbeat(
                        engine_id=77,
                        num_seqs=0,
                        num_tokens=0,
                        read_queue_tokens=0,
                        bytes_by_path={},
                        bytes_by_nic={},
                    )
                ),
            ),
            "control",
            "unknown_engine",
        ),
        (
            "progress of an unknown engine",
            lambda r: _to_scheduler(
                r, encode(Progress(request_id="x", engine_id=66, event="failed", error="forged"))
            ),
            "control",
            "unknown_engine",
        ),
        (
            "garbage bytes to the DE data port",
            lambda r: _to_data_port(r, "decode", b"\xc1\xff garbage"),
            "data",
            "undecodable",
        ),
        (
            "malformed DataMsg to the PE data port",
            lambda r: _to_data_port(r, "prefill", msgspec.msgpack.encode(["d", -5, 3])),
            "data",
            "invalid",
        ),
        (
            "DataMsg with bad reply_to to the DE data port",
            lambda r: _to_data_port(
                r, "decode", msgspec.msgpack.encode(DataMsg(1, "bogus://x", "e1", "e0", []))
            ),
            "data",
            "invalid",
        ),
        (
            "DataMsg whose frames do not match its items",
            lambda r: _to_data_port(
                r,
                "decode",
                msgspec.msgpack.encode(
                    DataMsg(1, "tcp://127.0.0.1:9", "e1", "e0", [ItemMeta("k", 0, 0, 1, 0, 64)])
                ),
                b"short",
            ),
            "data",
            "bad_frames",
        ),
        (
            "KV item with a marker layer (-2) to the DE data port",
            lambda r: _to_data_port(
                r,
                "decode",
                msgspec.msgpack.encode(
                    DataMsg(1, "tcp://127.0.0.1:9", "e1", "e0", [ItemMeta("k", -1, -2, 1, 0, 8)])
                ),
                b"\0" * 8,
            ),
            "data",
            "invalid",
        ),
        (
            "control message with a negative first token to the DE",
            lambda r: _to_data_port(
                r,
                "decode",
                msgspec.msgpack.encode(
                    [
                        "c",
                        1,
                        "tcp://127.0.0.1:9",
                        "e1",
                        "e0",
                        [{"t": "PrefillDone", "key": "k", "first_token": -1}],
                    ]
                ),
            ),
            "data",
            "invalid",
        ),
        (
            "PullLayer with start > stop to the DE",
            lambda r: _to_data_port(
                r,
                "decode",
                msgspec.msgpack.encode(
                    [
                        "c",
                        1,
                        "tcp://127.0.0.1:9",
                        "e1",
                        "e0",
                        [{"t": "PullLayer", "key": "k", "layer": 0, "start": 9, "stop": 3}],
                    ]
                ),
            ),
            "data",
            "invalid",
        ),
        (
            "unknown control message kind to the PE",
            lambda r: _to_data_port(
                r,
                "prefill",
                msgspec.msgpack.encode(
                    ["c", 1, "tcp://127.0.0.1:9", "e0", "e1", [{"t": "Reset", "key": "k"}]]
                ),
            ),
            "data",
            "invalid",
        ),
        (
            "control message with payload frames to the PE",
            lambda r: _to_data_port(
                r,
                "prefill",
                msgspec.msgpack.encode(
                    CtlMsg(1, "tcp://127.0.0.1:9", "e0", "e1", [HitsLoaded(key="k", end_tokens=0)])
                ),
                b"extra",
            ),
            "data",
            "bad_frames",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else None,
)
def test_forged_message_is_dropped_and_counted(rig, label: str, send, plane: str, cause: str) -> None:
    before = rig.metric(DROPPED, plane=plane, cause=cause)
    send(rig)
    assert rig.wait_metric(DROPPED, before, plane=plane, cause=cause) > before, label
    rig.assert_serving()


def test_engine_hello_with_a_taken_address_or_another_model_is_refused(rig) -> None:
    """An insider registering a fake engine at a live engine's data address (to receive its KV), or
    with another model's geometry, is told to shut down; the registered engines stay as they were."""
    de_addr = rig.data_addr("decode")
    for hello, cause in (
        (
            EngineHello(engine_id=-1, role="decode", node_id=1, data_addr=de_addr, pid=1, hbm_tokens=10),
            "duplicate_address",
        ),
        (
            EngineHello(
                engine_id=-1,
                role="decode",
                node_id=1,
                data_addr="tcp://127.0.0.1:9",
                pid=1,
                hbm_tokens=10,
                model_name="other",
                num_layers=99,
            ),
            "mismatch",
        ),
    ):
        before = rig.metric(DROPPED, plane="control", cause=cause)
        s = rig.sock(zmq.DEALER, rig.cluster.address)
        s.send(encode(hello))
        assert s.poll(10_000), "no answer to the hello"
        from dualpath.runtime.cluster.messages import Shutdown, decode

        reply = decode(s.recv())
        s.close(0)
        assert isinstance(reply, Shutdown) and "refused" in reply.reason, reply
        assert rig.wait_metric(DROPPED, before, plane="control", cause=cause) == before + 1
    health = rig.cluster.health()
    assert health is not None and len(health.engines) == 2
    rig.assert_serving()


def test_unreachable_reply_to_blocks_nothing(rig) -> None:
    """Acks to a well-formed address nobody listens on never block the receive thread."""
    s = rig.sock(zmq.PUSH, rig.data_addr("decode"))
    for i in range(50):
        s.send(msgspec.msgpack.encode(DataMsg(i, f"tcp://127.0.0.1:{10 + i}", "e1", "e0", [])))
    time.sleep(0.5)
    s.close(0)
    rig.assert_serving()


def test_engine_hello_with_a_bad_role_fails_no_in_flight_request(rig) -> None:
    """Before: the fake "foo" engine was registered, declared dead 5 s later, and every request in
    flight then failed with "no live foo engine left". Now it is dropped: requests kept in flight
    from before the forged hello until past the scheduler's engine timeout all succeed."""
    stop = threading.Event()
    statuses: list[int] = []

    def keep_busy() -> None:
        while not stop.is_set():
            statuses.append(rig.chat(max_tokens=40, ignore_eos=True).status_code)

    t = threading.Thread(target=keep_busy)
    t.start()
    time.sleep(0.3)
    _to_scheduler(rig, _foo_hello())
    time.sleep(rig.cluster.config.scheduler.engine_timeout_s + 1.5)
    stop.set()
    t.join(180)
    assert len(statuses) >= 2 and set(statuses) == {200}, statuses
    health = rig.cluster.health()
    assert health is not None and {e.role for e in health.engines} == {"prefill", "decode"}
    rig.assert_serving()
