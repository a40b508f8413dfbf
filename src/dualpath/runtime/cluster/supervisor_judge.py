"""The supervisor's judgement of hung processes (``Supervisor`` inherits it), made on fresh health
answers only: a scheduler that answers no health query for ``hung_s``; an engine process the
scheduler holds dead for ``hung_s`` while it runs, or has had no sign of (loading, starting or
ready) for ``hung_s`` since its start. A stretch without answers is nobody's fault: it is credited
to every engine's clock before judging. Each is killed (SIGKILL: a stopped process dies at it too),
then restarted by the supervisor's loop."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

import zmq

from dualpath.runtime.cluster.messages import DECODE_ERRORS, QueryReply, decode

if TYPE_CHECKING:
    from dualpath.runtime.cluster.config import SupervisorConfig
    from dualpath.runtime.cluster.local_procs import ClusterProcesses
    from dualpath.runtime.cluster.supervisor import _Child


class HungChecks:
    """Needs the supervisor's ``procs``, ``cfg``, ``children``, ``down``, ``hung_s``, clocks
    (``_answered_s``, ``_reply_s``, ``_judge_after_s``) and ``_note``."""

    procs: ClusterProcesses
    cfg: SupervisorConfig
    children: list[_Child]
    down: dict[str, float]
    hung_s: float
    _answered_s: float
    _reply_s: float
    _judge_after_s: float

    if TYPE_CHECKING:

        def _note(self, text: str) -> None: ...

    def _replies(self, sock: zmq.Socket, now: float) -> None:
        """Health answers: the scheduler lives; engines judged by what it says of their pids. No
        answer for ``hung_s``: kill the scheduler."""
        while sock.poll(0):
            try:
                reply = decode(sock.recv_multipart(zmq.NOBLOCK)[-1])
            except (zmq.Again, *DECODE_ERRORS):
                continue
            if isinstance(reply, QueryReply) and reply.health is not None:
                if now - self._reply_s > 2 * self.cfg.report_s:  # (blind meanwhile: not their fault)
                    for c in self.children:
                        c.heard_s += now - self._reply_s
                self._answered_s = self._reply_s = now
                self.down.pop("scheduler", None)
                self._judge_engines(reply, now)
        sched = self.procs.proc("scheduler")
        if now - self._answered_s > self.hung_s and sched.poll() is None and now >= self._judge_after_s:
            self._note(f"scheduler answered no health query for {now - self._answered_s:.0f} s; killing it")
            sched.send_signal(signal.SIGKILL)
            self._answered_s = now

    def _judge_engines(self, reply: QueryReply, now: float) -> None:
        assert reply.health is not None
        entries = {e.engine_id: e for e in reply.health.engines}
        since = {d.what: d.since_unix_s for d in reply.health.unavailable}
        wall = time.time()
        for c in self.children:
            if c.engine_id < 0 or c.dead_s is not None or c.given_up:
                continue
            e = entries.get(c.engine_id)
            mine = e is not None and e.pid == c.pid
            if mine and e.state in ("ready", "starting", "loading"):  # type: ignore[union-attr]
                c.heard_s = now
                if e.state == "ready":  # type: ignore[union-attr]
                    self.down.pop(c.what, None)
                continue
            if now < self._judge_after_s or self.procs.proc(c.name).poll() is not None:
                continue
            if mine and e.state == "dead":  # type: ignore[union-attr]
                held = wall - since.get(c.what, wall)
                if held > self.hung_s and now - c.started_s > self.hung_s:
                    self._kill(c, f"held dead for {held:.0f} s while its process runs")
            elif now - c.heard_s > self.hung_s:
                self._kill(c, f"no sign of it for {now - c.heard_s:.0f} s since it started")

    def _kill(self, child: _Child, why: str) -> None:
        self._note(f"{child.what} (pid {child.pid}) {why}; killing it")
        self.procs.proc(child.name).send_signal(signal.SIGKILL)  # (a stopped process dies at it too)
