"""``sched_guard.SpeakerGuard`` on the scheduler service in this process (fake engine sockets, a
test clock; engine pids are real local processes, so "its process still runs" is real): the rules
the cluster-level tests in tests/runtime/faults/test_impersonation.py cannot reach one by one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import zmq

from dualpath.runtime.cluster.messages import (
    EngineHello,
    Heartbeat,
    Shutdown,
    Supervision,
    Welcome,
    encode,
)

from .test_scheduler_service import _Rig


def _hello(eid: int, pid: int, port: int) -> EngineHello:
    return EngineHello(
        engine_id=eid, role="decode", node_id=1 + eid, data_addr=f"tcp://127.0.0.1:{port}", pid=pid,
        hbm_tokens=100_000, num_layers=2, kv_bytes_per_token_layer=64, block_size=16, vocab_size=100,
        max_context_len=4096,
    )  # fmt: skip


def _register(rig: _Rig, hello: EngineHello) -> zmq.Socket:
    s = rig.dealer()
    s.send(encode(hello))
    assert isinstance(rig.until_reply(s), Welcome)
    return s


def _exited_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _dropped(rig: _Rig, cause: str) -> int:
    m = rig.query("metrics").metrics
    assert m is not None
    return m.messages_dropped.get(f"control/{cause}", 0)


def _alive(rig: _Rig, eid: int) -> bool:
    return next(e.alive for e in rig.health().engines if e.engine_id == eid)


def _report(rig: _Rig, sock: zmq.Socket, lost: dict[int, int]) -> None:
    sock.send_multipart([b"", encode(Supervision(lost=lost))])
    rig.synced(sock)


def test_supervision_reports_are_checked_against_running_processes_and_one_socket(tmp_path: Path) -> None:
    rig = _Rig(tmp_path / "kv")
    try:
        _register(rig, _hello(0, os.getpid(), 9000))  # its process (this one) runs
        _register(rig, _hello(1, _exited_pid(), 9001))  # its process is gone
        supervisor, other = rig.dealer(), rig.dealer()
        _report(rig, supervisor, {0: os.getpid()})
        assert _dropped(rig, "forged_lost") == 1 and _alive(rig, 0)
        _report(rig, other, {1: rig.svc.supervision.pids[1]})  # a second reporter: refused
        assert _dropped(rig, "impersonation") == 1 and _alive(rig, 1)
        _report(rig, supervisor, {1: rig.svc.supervision.pids[1]})  # the supervisor: engine 1 is dead
        assert not _alive(rig, 1)
        rig.pump(6.0)  # the supervisor silent past SUPERVISOR_SILENT_S: another socket takes over
        _report(rig, other, {})
        assert _dropped(rig, "impersonation") == 1
    finally:
        rig.close()


def test_heartbeats_and_hellos_name_only_their_own_engine(tmp_path: Path) -> None:
    rig = _Rig(tmp_path / "kv")
    try:
        _register(rig, _hello(0, os.getpid(), 9000))
        beat = Heartbeat(
            engine_id=0, num_seqs=0, num_tokens=0, read_queue_tokens=0, bytes_by_path={}, bytes_by_nic={}
        )
        own, forger = rig.dealer(), rig.dealer()
        for sock in (own, forger, own):
            sock.send(encode(beat))
            rig.synced(sock)
        assert _dropped(rig, "impersonation") == 1  # the first heartbeat socket is engine 0's
        claim = rig.dealer()
        claim.send(encode(_hello(0, os.getpid() + 1, 9100)))
        reply = rig.until_reply(claim)
        assert isinstance(reply, Shutdown) and "live engine 0" in reply.reason
        assert _dropped(rig, "impersonation") == 2 and _alive(rig, 0)
        assert rig.svc.state.engines[0].data_addr.endswith(":9000")  # still the real one
    finally:
        rig.close()
