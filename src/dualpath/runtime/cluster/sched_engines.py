"""The scheduler service's side of engine liveness: silence turns into a death, a late heartbeat
into a revival, and a death into what becomes of the lost engine's requests (the rules are the
policy's, ``policy/recovery.py``). ``SchedulerCore`` (``sched_core.py``) inherits it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dualpath.policy.recovery import after_engine_loss, resumed_request
from dualpath.runtime.cluster.messages import Cancel, Peers, Reset
from dualpath.runtime.kvstore import loadable_hit_blocks

if TYPE_CHECKING:
    from dualpath.policy.views import RequestInfo
    from dualpath.runtime.cluster.api import SamplingParams
    from dualpath.runtime.cluster.config import SchedulerArgs
    from dualpath.runtime.cluster.sched_info import Reporter
    from dualpath.runtime.cluster.sched_stream import Streams
    from dualpath.runtime.cluster.state import ClusterState
    from dualpath.runtime.cluster.supervisor_view import SupervisionView
    from dualpath.runtime.kvstore import BlockStore

STALL_GRACE_S = 0.25  # a gap between two ticks beyond this counts as the scheduler's own stall


class EngineLiveness:
    """Needs the service's ``state``, ``report``, ``supervision``, ``args``, ``store``, request
    keys and records (``attempts``, ``current``, ``keys``, ``prompts``, ``streams``), ``_send``
    and ``_fail``."""

    args: SchedulerArgs
    state: ClusterState
    report: Reporter
    supervision: SupervisionView
    attempts: dict[str, int]
    current: dict[str, str]
    keys: dict[str, str]
    prompts: dict[str, tuple[list[int], SamplingParams]]
    streams: Streams
    store: BlockStore | None
    _last_check_s: float

    if TYPE_CHECKING:

        def _send(self, identity: bytes, msg: object) -> None: ...

        def _fail(self, rid: str, error: str) -> None: ...

    def _peers(self) -> dict[int, str]:
        return {e.engine_id: e.data_addr for e in self.state.engines.values() if e.alive}

    def _broadcast_peers(self) -> None:
        peers = self._peers()
        for e in self.state.engines.values():
            if e.alive:
                self._send(e.identity, Peers(peers=peers))

    def _check_engines(self, now: float) -> None:
        # Time this loop itself was stalled (descheduled, a paused VM, a slow handler) is not the
        # engines' silence: their heartbeats may not even have been sent yet. Credit it back.
        stalled = now - self._last_check_s - STALL_GRACE_S
        self._last_check_s = now
        if stalled > 0:
            for e in self.state.engines.values():
                e.last_seen_s += stalled
        for e in list(self.state.engines.values()):
            if e.alive and now - e.last_seen_s > self.args.cluster.scheduler.engine_timeout_s:
                self.engine_died(
                    e.engine_id,
                    f"{e.role} engine {e.engine_id} stopped responding "
                    f"(no heartbeat for {now - e.last_seen_s:.1f} s)",
                )

    def revive(self, eid: int, now: float) -> None:
        """A heartbeat came from an engine declared dead (it was stalled, not gone): its requests
        were already re-dispatched or failed, so it is told to drop what it holds, then serves again."""
        e = self.state.engines[eid]
        if self.supervision.is_lost(eid):  # a late heartbeat of a process that exited
            return
        gone_s = now - e.last_seen_s
        self._send(e.identity, Reset(reason=f"declared dead after {gone_s:.1f} s without heartbeat"))
        e.alive, e.last_seen_s = True, now
        self.state.add_engine(e)  # (its node's queues again, if it was the node's last engine)
        self.report.revivals += 1
        self.supervision.revived(eid)
        self.report.down.append(
            f"{e.role} engine {eid} answered again after {gone_s:.1f} s; back in service, emptied"
        )
        print(f"scheduler: {self.report.down[-1]}", flush=True)
        self._broadcast_peers()

    def engine_died(self, eid: int, reason: str) -> None:
        """Mark ``eid`` dead. Its requests resume (``policy/recovery.py``) from the tokens their
        clients have, on other engines, once (a second loss fails them); one its DE decodes
        already after a dead PE's prefill is not touched (its state lives on that DE)."""
        e = self.state.engines[eid]
        e.alive = False
        self.report.down.append(reason)
        self.supervision.died(eid, reason)  # (the death of its process, counted once)
        print(f"scheduler: {reason}", flush=True)
        self._requests_lost(eid, reason)
        self.supervision.orphans(time.monotonic())  # no live engine of a role: wait or fail
        self._broadcast_peers()

    def _requests_lost(self, eid: int, reason: str, count: bool = True) -> None:
        """What engine ``eid`` held is gone: each request resumes, fails or (a PE's, decoding on
        its DE) stays (``policy/recovery.py``); then the ledger drops the engine. ``count``: the
        loss counts toward the request's retries."""
        keep: set[str] = set()
        for rid in self.state.ledger.requests_on(eid):
            what = after_engine_loss(
                lost_is_de=eid == self.state.requests[rid].de,
                decoding=self.streams.de_started(rid),
                attempts=self.attempts.get(rid, 0) if count else 0,
            )
            if what == "keep":
                keep.add(rid)
            elif what == "fail":
                self._fail(rid, f"{reason}; request lost again after it resumed once")
            else:
                self.supervision.retried += 1
                self._resume(rid)
        self.state.engine_lost(eid, frozenset(keep))  # (an emptied DE group gives its queue back)

    def registered_again(self, eid: int, ident: bytes, now: float) -> None:
        """The live engine ``eid`` said hello again from the same process: a second "register
        again" (sent while its first hello waited behind a slow scheduler, e.g. one rebuilding the
        store index after a restart) made it drop every task and register once more. Not a death:
        its requests resume elsewhere (not counted as a retry), and it serves on under its id."""
        e = self.state.engines[eid]
        self._requests_lost(eid, f"{e.role} engine {eid} registered again", count=False)
        e.alive, e.identity, e.last_seen_s = True, ident, now
        self.state.add_engine(e)
        print(
            f"scheduler: {e.role} engine {eid} (pid {e.pid}) registered again; its requests resume",
            flush=True,
        )

    def _resume(self, rid: str) -> None:
        """Cancel the request's attempt on its engine that lives and queue it again, at the head,
        under a new attempt key, extended by the tokens its client has (their KV, up to the last
        block persisted, read from the store; the rest recomputed)."""
        req = self.state.requests[rid]
        for other in (req.pe, req.de):
            if other >= 0 and self.state.engines[other].alive:
                self._send(self.state.engines[other].identity, Cancel(request_id=self.current[rid]))
        done = self.streams.tokens(rid)
        self.streams.new_attempt(rid)
        info = self._resumed_info(rid, done) if done else None
        if info is not None:
            self.report.resumed(rid, info.cached_len)
        self.state.requeue(rid, info)
        self.keys.pop(self.current.get(rid, ""), None)
        self.attempts[rid] = self.attempts.get(rid, 0) + 1
        self.current[rid] = key = f"{rid}#{self.attempts[rid]}"
        self.keys[key] = rid

    def _resumed_info(self, rid: str, done: list[int]) -> RequestInfo:
        prompt, params = self.prompts[rid]
        ids, hit = prompt + done, 0
        if self.store is not None:
            bs = self.store.layout.block_size
            hit = min(len(self.store.match_prefix(ids)), loadable_hit_blocks(len(ids), bs)) * bs
        return resumed_request(
            rid, prompt_len=len(prompt), max_tokens=params.max_tokens, generated=len(done), hit_len=hit
        )
