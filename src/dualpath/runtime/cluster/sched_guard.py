"""Engines speak only for themselves: what the scheduler checks about who sent a message before it
acts on it (the key is the trust boundary; this keeps one buggy or rogue key holder from speaking
for others). Every refusal is dropped and counted (``dualpath_messages_dropped_total{plane=
"control", cause}``), never raised.

An engine has two sockets: its main one (the hello, token events, progress) and its heartbeat
thread's (``EngineLoading``, ``Heartbeat``, express progress). The main one is bound to the
engine at registration; the heartbeat one at the first heartbeat (or loading beat) naming the
engine after it registered, from a socket no other engine holds. Rules:

- ``Heartbeat`` / ``Progress`` naming engine X come from X's sockets (``impersonation``).
- ``EngineLoading`` with the pid of a registered engine X comes from X's heartbeat socket (it
  counts as X's heartbeat) (``impersonation``).
- ``EngineHello`` naming a live engine X from a socket that is not X's, while X's process still
  runs on this host (its registered pid exists), is refused: a restart comes only after its old
  process is gone (``impersonation``; the sender gets ``Shutdown``). For an engine on another
  host the scheduler cannot see its process, and a hello with its id and a new pid still counts
  as its restart.
- ``Supervision`` comes from no engine socket, and from one socket at a time: the first that
  reports, until it has been silent for ``SUPERVISOR_SILENT_S`` (the supervisor reports every
  second; a new one takes over after a restart) (``impersonation``). A ``lost`` or ``exited``
  entry naming a pid that still runs on this host is dropped from it (``forged_lost``): the
  supervisor reports a process only after it exited.
- ``Submit`` / ``Abort`` / ``Configure`` come from no engine socket (``engine_as_client``) and,
  when the cluster has an API key (``ClusterConfig.api_key_sha256``), carry it (``unauthorized``;
  a Submit gets ``Rejected``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec

from dualpath.runtime.cluster.messages import (
    Abort,
    Configure,
    EngineHello,
    EngineLoading,
    Heartbeat,
    Progress,
    QueryReply,
    Rejected,
    Shutdown,
    Submit,
    Supervision,
)

if TYPE_CHECKING:
    from dualpath.runtime.cluster.sched_core import SchedulerCore

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
SUPERVISOR_SILENT_S = 5.0  # supervisor_view.SUPERVISED_S: a report this old means none is supervising


def key_sha256(api_key: str) -> str:
    """What ``ClusterConfig.api_key_sha256`` holds for ``api_key`` (hex digest)."""
    return hashlib.sha256(api_key.encode()).hexdigest()


def process_runs(pid: int) -> bool:
    """Whether a live process with ``pid`` exists on this host (a zombie, exited but not yet
    reaped by its parent, does not count)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (someone else's process: it exists)
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # (no /proc: kill(0) said it exists)
    return state not in ("Z", "X")


class SpeakerGuard:
    """``check(ident, msg)`` -> the message to act on (possibly with forged parts removed) or None."""

    def __init__(self, core: SchedulerCore) -> None:
        self.core = core
        self.beats: dict[int, bytes] = {}  # engine id -> its heartbeat socket identity
        self.supervisor: tuple[bytes, float] | None = None  # its socket, last report (monotonic)
        cluster = core.args.cluster
        self.local_hosts = LOOPBACK | {cluster.host}
        self.api_key_sha256 = getattr(cluster, "api_key_sha256", "")

    # ------------------------------------------------------------------ helpers
    def _refuse(self, cause: str, detail: str) -> None:
        self.core.drops.drop("control", cause, detail)
        return None

    def _owner(self, ident: bytes) -> int | None:
        """The engine whose main or heartbeat socket is ``ident`` (None: no engine's)."""
        for e in self.core.state.engines.values():
            if e.identity == ident:
                return e.engine_id
        for eid, beat in self.beats.items():
            if beat == ident and eid in self.core.state.engines:
                return eid
        return None

    def _speaks_for(self, ident: bytes, eid: int) -> bool:
        """``ident`` is engine ``eid``'s main socket or its heartbeat socket (bound on first use)."""
        e = self.core.state.engines.get(eid)
        if e is None:
            return True  # (an engine this scheduler does not know: handled as unknown)
        if e.identity == ident or self.beats.get(eid) == ident:
            return True
        if eid not in self.beats and self._owner(ident) is None:
            self.beats[eid] = ident
            return True
        return False

    def _local_pid(self, eid: int) -> int | None:
        """The registered pid of engine ``eid`` if its process is on this host."""
        e = self.core.state.engines.get(eid)
        pid = self.core.supervision.pids.get(eid)
        if e is None or pid is None:
            return None
        host = urlsplit(e.data_addr).hostname or ""
        return pid if host in self.local_hosts or not host else None

    def _keyed(self, msg: Submit | Abort | Configure) -> bool:
        if not self.api_key_sha256:
            return True
        given = key_sha256(getattr(msg, "api_key", ""))
        return hmac.compare_digest(given, self.api_key_sha256)

    # ------------------------------------------------------------------ the check
    def check(self, ident: bytes, msg: object, now: float) -> object | None:
        if isinstance(msg, Heartbeat | Progress):
            if self._speaks_for(ident, msg.engine_id):
                return msg
            return self._refuse("impersonation", f"{type(msg).__name__} naming engine {msg.engine_id}")
        if isinstance(msg, EngineLoading):
            return self._loading(ident, msg)
        if isinstance(msg, EngineHello):
            return self._hello(ident, msg)
        if isinstance(msg, Supervision):
            return self._supervision(ident, msg, now)
        if isinstance(msg, Submit | Abort | Configure):
            return self._client(ident, msg)
        return msg

    def _loading(self, ident: bytes, msg: EngineLoading) -> EngineLoading | None:
        for eid, pid in self.core.supervision.pids.items():
            if pid == msg.pid and eid in self.core.state.engines and not self._speaks_for(ident, eid):
                return self._refuse("impersonation", f"loading beat with engine {eid}'s pid {pid}")
        return msg

    def _hello(self, ident: bytes, msg: EngineHello) -> EngineHello | None:
        e = self.core.state.engines.get(msg.engine_id)
        if e is None or not e.alive or e.identity == ident:
            if e is not None and e.identity != ident:
                self.beats.pop(e.engine_id, None)  # a new process: its heartbeat socket is new
            return msg
        pid = self._local_pid(e.engine_id)
        if pid is not None and process_runs(pid):
            why = f"hello naming live engine {e.engine_id} (pid {pid} runs; this one says pid {msg.pid})"
            self._refuse("impersonation", why)
            self.core._send(ident, Shutdown(reason=f"refused: {why}"))
            return None
        self.beats.pop(e.engine_id, None)
        return msg

    def _supervision(self, ident: bytes, msg: Supervision, now: float) -> Supervision | None:
        owner = self._owner(ident)
        if owner is not None:
            return self._refuse("impersonation", f"supervision report from engine {owner}'s socket")
        if self.supervisor is not None and self.supervisor[0] != ident:
            if now - self.supervisor[1] < SUPERVISOR_SILENT_S:
                return self._refuse("impersonation", "supervision report from a second socket")
        self.supervisor = (ident, now)
        lost = {eid: pid for eid, pid in msg.lost.items() if not self._runs(eid, pid)}
        exited = {eid: [p for p in pids if not self._runs(eid, p)] for eid, pids in msg.exited.items()}
        if len(lost) == len(msg.lost) and exited == msg.exited:
            return msg
        return msgspec.structs.replace(msg, lost=lost, exited=exited)

    def _runs(self, eid: int, pid: int) -> bool:
        """Engine ``eid``'s registered local process ``pid`` still runs (so a report of its exit
        is forged; counted)."""
        if self._local_pid(eid) == pid and process_runs(pid):
            self._refuse("forged_lost", f"engine {eid} reported exited while its pid {pid} runs")
            return True
        return False

    def _client(self, ident: bytes, msg: Submit | Abort | Configure) -> object | None:
        owner = self._owner(ident)
        if owner is not None:
            return self._refuse("engine_as_client", f"{type(msg).__name__} from engine {owner}'s socket")
        if self._keyed(msg):
            return msg
        self._refuse("unauthorized", f"{type(msg).__name__} without the cluster's API key")
        reason = "this cluster needs its API key with every request"
        if isinstance(msg, Submit):
            self.core._to_client(
                ident, Rejected(request_id=msg.request_id, kind="bad_request", reason=reason)
            )
        elif isinstance(msg, Configure):
            self.core._to_client(ident, QueryReply(query_id=msg.query_id, error=reason))
        return None
