"""The scheduler's event handling without a socket: ``SchedulerCore`` takes every message in
through ``handle`` and time through ``tick``, and sends through ``_send`` / ``_to_client``, which a
subclass provides (``SchedulerService`` in ``scheduler.py``: the ROUTER socket; ``adapter.py``: the
conformance trace recorder). Engine registration is ``sched_registry.py``, requests
``sched_requests.py``, engine liveness ``sched_engines.py``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import msgspec

from dualpath.policy import Scheduler
from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.config import SchedulerArgs
from dualpath.runtime.cluster.messages import (
    DECODE_ERRORS,
    Abort,
    Configure,
    DecodeTask,
    EngineHello,
    EngineLoading,
    EngineReady,
    Heartbeat,
    PrefillTask,
    Progress,
    Query,
    ReadPlan,
    Submit,
    Supervision,
    Tokens,
    decode,
)
from dualpath.runtime.cluster.read_rate import StorageReadRate
from dualpath.runtime.cluster.sched_engines import EngineLiveness
from dualpath.runtime.cluster.sched_guard import SpeakerGuard
from dualpath.runtime.cluster.sched_info import Reporter
from dualpath.runtime.cluster.sched_persist import StateFile, restore, snapshot
from dualpath.runtime.cluster.sched_registry import EngineRegistry
from dualpath.runtime.cluster.sched_requests import RequestLifecycle
from dualpath.runtime.cluster.sched_stream import Streams
from dualpath.runtime.cluster.state import ClusterState
from dualpath.runtime.cluster.supervisor_view import SupervisionView
from dualpath.runtime.kvstore import BlockStore
from dualpath.runtime.transfer.drops import DropCounter


class SchedulerCore(EngineRegistry, RequestLifecycle, EngineLiveness, ABC):
    """The service's event handling without sockets: every message goes in through ``handle``
    (decoded: ``dispatch_msg``), time through ``tick``; everything it sends leaves through
    ``_send`` (to an engine's socket identity) and ``_to_client``, which a subclass provides
    (``SchedulerService``: the ROUTER socket; ``runtime/cluster/adapter.py``: a recorder that
    replays the policy's conformance traces through this very code)."""

    def __init__(self, args: SchedulerArgs) -> None:
        self.args = args
        self.state = ClusterState()
        self.sched: Scheduler | None = None  # built at the first engine hello (needs the KV geometry)
        self.store: BlockStore | None = None
        self.hello: EngineHello | None = None
        self.clients: dict[str, bytes] = {}
        self.prompts: dict[str, tuple[list[int], SamplingParams]] = {}
        self.report = Reporter(self)
        self.supervision = SupervisionView(self)
        # Engines see a key per dispatch attempt (rid, then rid#1, ... after re-dispatch), so late
        # messages or KV of an attempt that lost an engine never mix with the next attempt.
        self.keys: dict[str, str] = {}  # engine-facing key -> client request id
        self.current: dict[str, str] = {}  # client request id -> its current key
        self.attempts: dict[str, int] = {}
        self.streams = Streams()  # what each client has been sent (sched_stream.py)
        self.running = True
        self._last_check_s = float("inf")  # no stall before the first tick
        self.drops = DropCounter("scheduler")
        self._read_rate = StorageReadRate()
        self.guard = SpeakerGuard(self)
        self.persist = StateFile(args.state_file)  # settings and counters across restarts
        restore(self, self.persist.load())

    def settings_changed(self) -> None:
        self.persist.save(snapshot(self), time.monotonic(), force=True)

    @abstractmethod
    def _send(self, identity: bytes, msg: object) -> None:
        """Send ``msg`` to the engine whose main socket is ``identity``."""

    @abstractmethod
    def _to_client(self, identity: bytes, msg: object) -> None:
        """Send ``msg`` to the client whose socket is ``identity``."""

    def handle(self, ident: bytes, raw: bytes, now: float | None = None) -> None:
        """Decode, validate and act on one message; a bad one is dropped and counted, never raised
        (garbage, a forged or a stale message must not kill the scheduler or fail others)."""
        try:
            msg = decode(raw)
        except DECODE_ERRORS as exc:
            cause = "invalid" if isinstance(exc, msgspec.ValidationError) else "undecodable"
            self.drops.drop("control", cause, str(exc))
            return
        now = time.monotonic() if now is None else now
        msg = self.guard.check(ident, msg, now)  # engines speak only for themselves (sched_guard.py)
        if msg is None:
            return
        try:
            self.dispatch_msg(ident, msg, now)
        except Exception as exc:  # noqa: BLE001 - a handler bug must not end the scheduler
            self.drops.drop("control", "handler_error", f"{type(msg).__name__}: {type(exc).__name__}: {exc}")

    def dispatch_msg(self, ident: bytes, msg: object, now: float) -> None:
        """Act on one decoded message that came from socket ``ident`` at ``now``."""
        if isinstance(msg, Submit):
            self._submit(ident, msg, now)
        elif isinstance(msg, Tokens):
            self._tokens(ident, msg, now)
        elif isinstance(msg, Heartbeat):
            if msg.engine_id not in self.state.engines:  # (it registered with an earlier scheduler)
                self.supervision.unknown_heartbeat(ident, msg, now)
                return
            self.report.heartbeat(msg, now)
        elif isinstance(msg, Progress):
            self._progress(msg, now)
        elif isinstance(msg, Abort):
            self._abort(msg, now)
        elif isinstance(msg, Query):
            self._to_client(ident, self.report.answer(msg))
        elif isinstance(msg, EngineHello):
            self._hello(ident, msg, now)
        elif isinstance(msg, Configure):
            self._to_client(ident, self._configure(msg))
        elif isinstance(msg, EngineReady):
            self._ready(ident, msg)
        elif isinstance(msg, EngineLoading):
            self.supervision.on_loading(msg, now)
        elif isinstance(msg, Supervision):
            self.supervision.on_report(msg, now)
        else:  # scheduler -> engine/client messages never come this way
            self.drops.drop("control", "unexpected", type(msg).__name__)

    # ------------------------------------------------------------------ scheduling
    def tick(self, now: float) -> None:
        self._check_engines(now)
        self.supervision.orphans(now)
        self.supervision.forget_left(now)
        self.persist.save(snapshot(self), now)
        if self.sched is None:
            return
        for rid in self.state.fetch(self.sched, now):
            self._dispatch(rid, now)

    def _dispatch(self, rid: str, now: float) -> None:
        req = self.state.requests[rid]
        a = req.assignment
        assert a is not None  # (placed by this tick's fetch)
        prompt, params = self.prompts[rid]
        done = self.streams.tokens(rid)  # (a resumed request: what its client has already)
        ids, k = prompt + done, len(done)
        self.report.dispatched(rid, now)
        key = self.current[rid]
        read = ReadPlan.of(a)
        self._send(
            self.state.engines[req.de].identity,
            DecodeTask(request_id=key, prompt_token_ids=ids, read=read, params=params,
                       prefill_engine=req.pe, num_generated=k),
        )  # fmt: skip
        self._send(
            self.state.engines[req.pe].identity,
            PrefillTask(request_id=key, prompt_token_ids=ids, read=read, params=params,
                        decode_engine=req.de, num_generated=k),
        )  # fmt: skip
