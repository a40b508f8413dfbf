"""Issue 30, item 8: an insider holding the cluster key may speak only for itself. Against the
real local cluster of this package (1P1D, CURVE, supervised): a forged ``Supervision(lost=...)``,
an ``EngineHello`` claiming the live decode engine's id, heartbeats, progress and loading beats
naming another engine, client messages from an engine's socket are refused and counted, and the
decode engine keeps serving (before: the forged report or hello declared it dead and failed its
streams). Early KV that no task claims is capped in bytes (before: +229 MB resident from 200 MB
sent). ``Submit`` needs the API key where one is set (before: the cluster key was enough)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import msgspec
import zmq

from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.messages import (
    EngineHello,
    EngineLoading,
    Heartbeat,
    Progress,
    Query,
    Rejected,
    Shutdown,
    Submit,
    Supervision,
    Welcome,
    decode,
    encode,
)
from dualpath.runtime.transfer.zmq_wire import DataMsg, ItemMeta

DROPPED = "dualpath_messages_dropped_total"


def _decode_engine(rig) -> tuple[int, int]:
    """(engine id, pid) of the live decode engine."""
    health = rig.cluster.health()
    assert health is not None
    eid = next(e.engine_id for e in health.engines if e.role == "decode" and e.alive)
    return eid, rig.cluster.pids()[f"engine{eid}"]


def _send(rig, msg: object, *, client: bool = True) -> zmq.Socket:
    """Send ``msg`` from a fresh keyed socket (as a client: with the empty delimiter frame)."""
    s = rig.sock(zmq.DEALER, rig.cluster.address)
    s.send_multipart([b"", encode(msg)] if client else [encode(msg)])
    time.sleep(0.3)  # (LINGER is 0: let it leave before a close)
    return s


def _streaming_while(rig, action) -> list[int]:  # type: ignore[no-untyped-def]
    """Statuses of chats kept in flight (40 tokens each) from before ``action`` until 2 s after."""
    stop, statuses = threading.Event(), []

    def busy() -> None:
        while not stop.is_set():
            statuses.append(rig.chat(max_tokens=40, ignore_eos=True).status_code)

    t = threading.Thread(target=busy)
    t.start()
    time.sleep(0.5)
    action()
    time.sleep(2.0)
    stop.set()
    t.join(120)
    return statuses


def _refused_reports(rig) -> float:  # type: ignore[no-untyped-def]
    return rig.metric(DROPPED, plane="control", cause="forged_lost") + rig.metric(
        DROPPED, plane="control", cause="impersonation"
    )


def test_a_forged_supervision_report_does_not_kill_a_live_engine(rig) -> None:
    """A report naming the live decode engine's pid as lost, from a second socket while the real
    supervisor reports: refused (and its ``lost`` entry would be dropped anyway: the pid runs)."""
    eid, pid = _decode_engine(rig)
    before = _refused_reports(rig)
    statuses = _streaming_while(rig, lambda: _send(rig, Supervision(lost={eid: pid})).close(0))
    assert statuses and set(statuses) == {200}, statuses
    deadline = time.monotonic() + 30
    while _refused_reports(rig) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _refused_reports(rig) == before + 1
    rig.assert_serving()


def test_a_hello_claiming_the_live_engines_id_is_refused(rig) -> None:
    eid, pid = _decode_engine(rig)
    health = rig.cluster.health()
    assert health is not None
    node = next(e.node_id for e in health.engines if e.engine_id == eid)
    hello = EngineHello(
        engine_id=eid, role="decode", node_id=node, data_addr="tcp://127.0.0.1:9", pid=pid + 1, hbm_tokens=10
    )
    before = rig.metric(DROPPED, plane="control", cause="impersonation")
    replies: list[object] = []

    def claim() -> None:
        s = _send(rig, hello, client=False)
        assert s.poll(10_000), "no answer to the hello"
        replies.append(decode(s.recv()))
        s.close(0)

    statuses = _streaming_while(rig, claim)
    assert isinstance(replies[0], Shutdown) and "refused" in replies[0].reason, replies
    assert statuses and set(statuses) == {200}, statuses
    assert rig.wait_metric(DROPPED, before, plane="control", cause="impersonation") == before + 1
    rig.assert_serving()


def _rogue_engine(cluster) -> zmq.Socket:  # type: ignore[no-untyped-def]
    """A keyed socket registered as a new decode engine (the key admits it) with its own id."""
    from dualpath.runtime.cluster.kvio import Geometry
    from dualpath.runtime.model import load_decoder

    info = _query(cluster, "info").info
    decoder, _ = load_decoder(info.model_name, device="cpu")
    layout = Geometry.of(decoder, info.block_size).layout()
    hello = EngineHello(
        engine_id=-1, role="decode", node_id=9, data_addr="tcp://127.0.0.1:7", pid=4_000_000, hbm_tokens=10,
        model_name=info.model_name, num_layers=layout.num_layers, block_size=info.block_size,
        kv_bytes_per_token_layer=layout.kv_bytes_per_token_layer, vocab_size=info.vocab_size,
        max_context_len=info.max_context_len,
    )  # fmt: skip
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    cluster.keys.client(s)
    s.connect(cluster.address)
    s.send(encode(hello))
    assert s.poll(10_000)
    welcome = decode(s.recv())
    assert isinstance(welcome, Welcome), welcome
    return s


def test_messages_naming_another_engine_are_refused(rig) -> None:
    eid, pid = _decode_engine(rig)
    beat = Heartbeat(
        engine_id=eid, num_seqs=0, num_tokens=0, read_queue_tokens=0, bytes_by_path={}, bytes_by_nic={}
    )
    before = rig.metric(DROPPED, plane="control", cause="impersonation")
    forged = [
        beat,
        Progress(request_id="x", engine_id=eid, event="read_done"),
        EngineLoading(engine_id=eid, role="decode", node_id=1, pid=pid),
    ]
    for msg in forged:
        _send(rig, msg, client=False).close(0)
    want = before + len(forged)
    assert rig.wait_metric(DROPPED, want - 1, plane="control", cause="impersonation") == want
    rig.assert_serving()


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_early_kv_no_task_claims_is_capped_in_bytes(rig) -> None:
    """400 MB of KV items for request keys that never get a task, sent to the decode engine's
    data port: its resident memory grows by at most the cap (256 MiB) plus slack, and the
    items beyond the cap are dropped and counted."""
    from dualpath.runtime.cluster.worker_base import ORPHAN_MAX_BYTES

    eid, pid = _decode_engine(rig)
    before_rss = _rss_bytes(pid)
    before = rig.metric(DROPPED, plane="data", cause="orphan_cap")
    item_bytes, n = 1 << 20, 400
    s = rig.sock(zmq.PUSH, rig.data_addr("decode"))
    payload = b"\x01" * item_bytes
    for i in range(n):
        meta = ItemMeta(f"orphan-{i}", 0, 0, 1, 0, item_bytes)
        s.send_multipart(
            [msgspec.msgpack.encode(DataMsg(i, "tcp://127.0.0.1:9", f"e{eid}", "e0", [meta])), payload]
        )
    s.setsockopt(zmq.LINGER, 60_000)
    s.close()  # (blocks until all 400 MB left)
    dropped, deadline = 0.0, time.monotonic() + 60
    while time.monotonic() < deadline:  # until the drops stop growing: every item handled
        time.sleep(1.0)
        now = rig.metric(DROPPED, plane="data", cause="orphan_cap") - before
        if now == dropped and now > 0:
            break
        dropped = now
    assert dropped >= n - ORPHAN_MAX_BYTES // item_bytes - 1, dropped
    limit, deadline = ORPHAN_MAX_BYTES + (64 << 20), time.monotonic() + 30
    while (grown := _rss_bytes(pid) - before_rss) >= limit and time.monotonic() < deadline:
        time.sleep(1.0)  # (the transport's receive buffers drain; held early KV stays)
    assert grown < limit, grown  # before: +406 MB for 400 MB sent, held for 60 s
    rig.assert_serving()


def test_submit_needs_the_api_key_and_an_engine_socket_is_no_client(tmp_path: Path) -> None:
    """A cluster with an API key: Submit without it, or with a wrong one, is Rejected; with it,
    served. A registered engine's own socket cannot submit nor report another engine lost."""
    from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig
    from dualpath.runtime.cluster.local import LocalCluster
    from dualpath.runtime.cluster.sched_guard import key_sha256

    cfg = ClusterConfig(
        kv_dir=str(tmp_path / "kv"),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=1,
        api_key_sha256=key_sha256("sekrit"),
        engine=EngineConfig(heartbeat_s=0.1),
    )
    with LocalCluster(cfg, auth=True) as cluster:
        assert cluster.keys is not None
        got = {}
        for label, key in (("none", ""), ("wrong", "guess"), ("right", "sekrit")):
            s = zmq.Context.instance().socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            cluster.keys.client(s)
            s.connect(cluster.address)
            msg = Submit(
                request_id=label, prompt_token_ids=[5, 6, 7], params=SamplingParams(max_tokens=2), api_key=key
            )
            s.send_multipart([b"", encode(msg)])
            assert s.poll(60_000), label
            got[label] = decode(s.recv_multipart()[-1])
            s.close(0)
        de = next(
            int(n.removeprefix("engine")) for n in cluster.pids() if n.startswith("engine") and n != "engine0"
        )
        rogue = _rogue_engine(cluster)
        rogue.send(encode(Supervision(lost={de: cluster.pids()[f"engine{de}"]})))
        rogue.send(
            encode(
                Submit(
                    request_id="from-engine",
                    prompt_token_ids=[5],
                    params=SamplingParams(max_tokens=2),
                    api_key="sekrit",
                )
            )
        )
        time.sleep(1.0)
        rogue.close(0)
        dropped = _query(cluster, "metrics").metrics.messages_dropped
        health = cluster.health()
    assert isinstance(got["none"], Rejected) and "API key" in got["none"].reason
    assert isinstance(got["wrong"], Rejected)
    assert not isinstance(got["right"], Rejected), got["right"]
    assert health is not None and next(e for e in health.engines if e.engine_id == de).alive
    assert dropped.get("control/impersonation", 0) >= 1 and dropped.get("control/engine_as_client", 0) >= 1
    assert dropped.get("control/unauthorized", 0) == 2


def _query(cluster, what: str):  # type: ignore[no-untyped-def]
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    cluster.keys.client(s)
    s.connect(cluster.address)
    s.send_multipart([b"", encode(Query(query_id=7, what=what))])
    assert s.poll(10_000)
    reply = decode(s.recv_multipart()[-1])
    s.close(0)
    return reply
