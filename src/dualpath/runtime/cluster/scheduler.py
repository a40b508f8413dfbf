"""The scheduler service: one ROUTER socket for engines and clients, request state, policy calls.

Each tick (every ``tick_s`` or after messages) it: marks engines dead after ``engine_timeout_s``
without a message and re-dispatches or fails their requests; runs one fetch round of the policy's
ledger (``ClusterState.fetch``: DE groups, then PE groups, in ``policy.fetch.RUNTIME_ORDER``); sends
DecodeTask then PrefillTask for each request that got both engines. Token events from DEs are forwarded to the
request's client with RequestStats on the last one. ``SchedulerCore`` is all of that without a
socket (messages in, messages out); ``SchedulerService`` puts it on the ROUTER socket, and the
conformance trace driver (``adapter.py``) feeds it the recorded traces.
"""

from __future__ import annotations

import secrets
import time
from abc import ABC, abstractmethod

import msgspec
import zmq

from dualpath.policy import Scheduler, SchedulerConfig, make_scheduler
from dualpath.policy import views as pv
from dualpath.runtime.cluster.api import SamplingParams, TokenEvent
from dualpath.runtime.cluster.config import SchedulerArgs
from dualpath.runtime.cluster.messages import (
    DECODE_ERRORS,
    Abort,
    Cancel,
    Configure,
    DecodeTask,
    EngineHello,
    EngineLoading,
    Heartbeat,
    PrefillTask,
    Progress,
    Query,
    QueryReply,
    ReadPlan,
    Rejected,
    Shutdown,
    Submit,
    Supervision,
    Tokens,
    Welcome,
    decode,
    encode,
)
from dualpath.runtime.cluster.read_rate import StorageReadRate
from dualpath.runtime.cluster.sched_engines import EngineLiveness
from dualpath.runtime.cluster.sched_info import Reporter
from dualpath.runtime.cluster.state import ClusterState, EngineState
from dualpath.runtime.cluster.supervisor_view import SupervisionView
from dualpath.runtime.kvstore import BlockStore, loadable_hit_blocks
from dualpath.runtime.transfer.auth import Gatekeeper, load_keys
from dualpath.runtime.transfer.drops import DropCounter

MAX_ERROR_CHARS = 2000  # error texts sent to clients (TokenEvent.error is bounded at decode)


def _seeded(params: SamplingParams) -> SamplingParams:
    """``params`` with a seed: an unseeded request drawing tokens (temperature > 0) gets a fresh
    random one here, once, so its PE and DE steps (and a re-dispatch) draw from one stream while
    two unseeded requests do not draw the same tokens (before: every unseeded request used 0)."""
    if params.seed is not None or params.temperature == 0.0:
        return params
    return msgspec.structs.replace(params, seed=secrets.randbits(63))


class SchedulerCore(EngineLiveness, ABC):
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
        self.running = True
        self._last_check_s = float("inf")  # no stall before the first tick
        self.drops = DropCounter("scheduler")
        self._read_rate = StorageReadRate()

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
            self._drop(msg.request_id, cancel=True)
        elif isinstance(msg, Query):
            self._to_client(ident, self.report.answer(msg))
        elif isinstance(msg, EngineHello):
            self._hello(ident, msg, now)
        elif isinstance(msg, Configure):
            self._to_client(ident, self._configure(msg))
        elif isinstance(msg, EngineLoading):
            self.supervision.on_loading(msg, now)
        elif isinstance(msg, Supervision):
            self.supervision.on_report(msg, now)
        else:  # scheduler -> engine/client messages never come this way
            self.drops.drop("control", "unexpected", type(msg).__name__)

    def _engine_of(self, ident: bytes) -> EngineState | None:
        """The registered engine whose main socket is ``ident`` (None: not an engine)."""
        for e in self.state.engines.values():
            if e.identity == ident:
                return e
        return None

    # ------------------------------------------------------------------ engines
    def _hello(self, ident: bytes, msg: EngineHello, now: float) -> None:
        """Register an engine; refuse (Shutdown with the reason) one whose data address a live
        engine already has, or whose model/KV geometry differs from the cluster's."""
        why, cause = None, ""
        taken = [e.engine_id for e in self.state.engines.values() if e.alive and e.data_addr == msg.data_addr]
        if taken:
            why, cause = f"data address {msg.data_addr} is engine {taken[0]}'s", "duplicate_address"
        elif self.hello is not None and msg.geometry() != self.hello.geometry():
            why, cause = (
                (
                    f"a {msg.role} engine's model/KV geometry {msg.geometry()} differs from "
                    f"the cluster's {self.hello.geometry()}"
                ),
                "mismatch",
            )
        if why is not None:
            self.drops.drop("control", cause, why)
            self._send(ident, Shutdown(reason=f"refused: {why}"))
            return
        self.supervision.on_hello(msg)  # the same engine restarted: its old self dies first
        eid = msg.engine_id
        if eid < 0 or (eid in self.state.engines and self.state.engines[eid].alive):
            eid = max(self.state.engines, default=-1) + 1
        self.state.add_engine(
            EngineState(
                engine_id=eid,
                role=msg.role,
                node_id=msg.node_id,
                hbm_tokens=msg.hbm_tokens,
                last_seen_s=now,
                data_addr=msg.data_addr,
                identity=ident,
            )
        )
        self.supervision.registered(eid, msg.pid)
        if self.sched is None:
            self._setup(msg)
        leader = min(e.engine_id for e in self.state.groups(msg.role)[msg.node_id])
        self._send(ident, Welcome(engine_id=eid, is_leader=leader == eid, peers=self._peers()))
        self._broadcast_peers()

    def _setup(self, msg: EngineHello) -> None:
        from dualpath.runtime.kvstore import BlockLayout

        self.hello = msg
        layout = BlockLayout(
            num_layers=msg.num_layers,
            block_size=msg.block_size,
            kv_bytes_per_token_layer=msg.kv_bytes_per_token_layer,
        )
        cap, cluster = self.args.kv_capacity_bytes, self.args.cluster
        if self.store is None or self.store.layout != layout:  # (kept across Configure)
            self.store = BlockStore(
                cluster.kv_dir, layout, "auto" if cap is None else cap, file_mode=cluster.kv_file_mode
            )
        snic = self._read_bytes_per_s()
        cfg = SchedulerConfig.from_rates(
            snic_bytes_per_s=snic,
            kv_bytes_per_token=layout.kv_bytes_per_token,
            prefill_tokens_per_s=cluster.scheduler.beta_rate(cluster.model),
            batching="tokens",
            block_size=msg.block_size,
        )
        self.state.ledger.set_read_rate(snic / layout.kv_bytes_per_token)
        self.sched = make_scheduler(cluster.policy, cfg)

    def _read_bytes_per_s(self) -> float:
        """A node's storage read rate behind alpha (``runtime/cluster/read_rate.py``)."""
        return self._read_rate.bytes_per_s(self.args.cluster)

    @property
    def read_rate_source(self) -> str:
        return self._read_rate.source

    def _configure(self, msg: Configure) -> QueryReply:
        from dualpath.core.errors import DualpathError

        if self.report.timing:
            return QueryReply(query_id=msg.query_id, error="requests are in flight; configure when idle")
        if self.hello is None:
            return QueryReply(query_id=msg.query_id, error="no engine registered yet")
        try:
            c = self.args.cluster
            snic = c.traffic.snic_gbps if msg.snic_gbps is None else msg.snic_gbps
            c = msgspec.structs.replace(
                c,
                policy=msg.policy,
                traffic=msgspec.structs.replace(c.traffic, snic_gbps=snic, read_free=msg.read_free),
            )
            self.args = msgspec.structs.replace(self.args, cluster=c)
            self._setup(self.hello)
        except DualpathError as exc:
            return QueryReply(query_id=msg.query_id, error=str(exc))
        for e in self.state.engines.values():
            if e.alive:
                self._send(e.identity, msg)
        return QueryReply(query_id=msg.query_id, health=self.report.health())

    # ------------------------------------------------------------------ requests
    def _submit(self, ident: bytes, msg: Submit, now: float) -> None:
        rid, n = msg.request_id, len(msg.prompt_token_ids)
        reject = self.report.validate(msg)
        if reject is not None:
            self._to_client(ident, Rejected(request_id=rid, kind=reject[0], reason=reject[1]))
            return
        assert self.store is not None and self.hello is not None
        bs = self.hello.block_size
        hit = min(len(self.store.match_prefix(msg.prompt_token_ids)), loadable_hit_blocks(n, bs)) * bs
        self.admit(ident, rid, list(msg.prompt_token_ids), msg.params, hit, now)

    def admit(
        self, ident: bytes, rid: str, prompt: list[int], params: SamplingParams, hit_len: int, now: float
    ) -> None:
        """Take a valid request of client ``ident`` whose first ``hit_len`` tokens the store holds
        into the queue (what a Submit becomes once checked against the store)."""
        self.clients[rid] = ident
        self.current[rid] = self.keys[rid] = rid
        self.prompts[rid] = (prompt, _seeded(params))
        self.report.submitted(rid, len(prompt), hit_len, now)
        self.state.submit(
            pv.RequestInfo(
                request_id=rid, cached_len=hit_len, new_len=len(prompt) - hit_len, gen_len=params.max_tokens
            )
        )

    def _rid(self, key: str) -> str | None:
        """Client request id of an engine-facing key; None if stale (an earlier attempt)."""
        rid = self.keys.get(key)
        return rid if rid is not None and self.current.get(rid) == key else None

    def _progress(self, msg: Progress, now: float) -> None:
        rid = self._rid(msg.request_id)
        e = self.state.engines.get(msg.engine_id)
        if e is None:
            self.drops.drop("control", "unknown_engine", f"progress from engine {msg.engine_id}")
            return
        e.last_seen_s = now
        if rid is None:
            return
        req = self.state.requests.get(rid)
        if req is None or msg.engine_id not in (req.pe, req.de):
            self.drops.drop("control", "not_assigned", f"progress of {rid!r} from engine {msg.engine_id}")
            return
        if msg.event == "read_done" and e is not None:
            self.state.read_done(rid, e.node_id)
        elif msg.event == "prefill_done":
            self.state.prefill_done(rid)
            if msg.hit_len is not None:
                self.report.loaded(rid, msg.hit_len)
        elif msg.event == "failed":
            self._fail(rid, msg.error or "engine failure")

    def _tokens(self, sender: bytes, msg: Tokens, now: float) -> None:
        de = self._engine_of(sender)
        if de is None or de.role != "decode":
            self.drops.drop("control", "unknown_engine", "token events not from a decode engine")
            return
        for ev in msg.events:
            rid = self._rid(ev.request_id)
            ident = self.clients.get(rid) if rid is not None else None
            req = self.state.requests.get(rid) if rid is not None else None
            if rid is None or ident is None or req is None:
                continue
            if req.de != de.engine_id:
                self.drops.drop("control", "not_assigned", f"tokens of {rid!r} from engine {de.engine_id}")
                continue
            ev = msgspec.structs.replace(ev, request_id=rid)
            if ev.is_last:
                ev = msgspec.structs.replace(ev, stats=self.report.stats(rid, req, now))
                self._drop(rid, cancel=False)
            else:
                self.report.token(rid, now)
            self._to_client(ident, Tokens(events=[ev]))

    def _fail(self, rid: str, error: str) -> None:
        error = error[:MAX_ERROR_CHARS]
        ident = self.clients.get(rid)
        if ident is not None:
            self._to_client(
                ident,
                Tokens(
                    events=[
                        TokenEvent(
                            request_id=rid,
                            index=self.report.num_tokens(rid),
                            token_id=-1,
                            finish_reason="error",
                            error=error,
                        )
                    ]
                ),
            )
        self.report.failed(rid)
        self._drop(rid, cancel=True)

    def _drop(self, rid: str, cancel: bool) -> None:
        req = self.state.finish(rid)
        if req is not None and cancel:
            for eid in (req.pe, req.de):
                if eid >= 0 and self.state.engines[eid].alive:
                    self._send(self.state.engines[eid].identity, Cancel(request_id=self.current[rid]))
        self.keys.pop(self.current.pop(rid, ""), None)
        self.attempts.pop(rid, None)
        self.clients.pop(rid, None)
        self.prompts.pop(rid, None)
        self.report.forget(rid)

    # ------------------------------------------------------------------ scheduling
    def tick(self, now: float) -> None:
        self._check_engines(now)
        self.supervision.orphans(now)
        if self.sched is None:
            return
        for rid in self.state.fetch(self.sched, now):
            self._dispatch(rid, now)

    def _dispatch(self, rid: str, now: float) -> None:
        req = self.state.requests[rid]
        a = req.assignment
        assert a is not None  # (placed by this tick's fetch)
        ids, params = self.prompts[rid]
        self.report.dispatched(rid, now)
        key = self.current[rid]
        assert req.assignment is not None
        read = ReadPlan.of(req.assignment)
        self._send(
            self.state.engines[req.de].identity,
            DecodeTask(request_id=key, prompt_token_ids=ids, read=read, params=params, prefill_engine=req.pe),
        )
        self._send(
            self.state.engines[req.pe].identity,
            PrefillTask(request_id=key, prompt_token_ids=ids, read=read, params=params, decode_engine=req.de),
        )


class SchedulerService(SchedulerCore):
    """The scheduler process: ``SchedulerCore`` on one zmq ROUTER socket (CURVE when keyed)."""

    def __init__(self, args: SchedulerArgs) -> None:
        super().__init__(args)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        keys = load_keys(args.key_file)
        self.gate = Gatekeeper(self.ctx, keys) if keys else None
        if keys:
            keys.server(self.sock)
        self.monitor = self.gate.monitor(self.sock) if self.gate else None
        bind = args.bind.replace(":0", ":*") if args.bind.endswith(":0") else args.bind
        self.sock.bind(bind)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    # ------------------------------------------------------------------ main loop
    def serve_forever(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while self.running:
            self.run_once(poller, int(self.args.cluster.scheduler.tick_s * 1000) or 1)
        self.close()

    def run_once(self, poller: zmq.Poller, timeout_ms: int, now: float | None = None) -> None:
        """Handle what arrived within ``timeout_ms`` (at most 1,000 messages), then tick at ``now``
        (the clock by default; tests pass their own)."""
        if poller.poll(timeout_ms):
            for _ in range(1000):
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handle(frames[0], frames[-1], now)
        if self.monitor is not None:
            Gatekeeper.count(self.monitor, self.drops, "control")
        self.tick(time.monotonic() if now is None else now)

    def close(self) -> None:
        for e in self.state.engines.values():
            if e.alive:
                self._send(e.identity, Shutdown(reason="scheduler stopping"))
        if self.gate is not None:
            self.gate.stop()
        self.sock.close(0)
        self.ctx.term()

    def _send(self, identity: bytes, msg: object) -> None:
        self.sock.send_multipart([identity, encode(msg)])  # type: ignore[arg-type]

    def _to_client(self, identity: bytes, msg: object) -> None:
        self.sock.send_multipart([identity, b"", encode(msg)])  # type: ignore[arg-type]


def main() -> None:
    """``python -m dualpath.runtime.cluster.scheduler '<SchedulerArgs as JSON>'``."""
    import sys
    from pathlib import Path

    svc = SchedulerService(msgspec.json.decode(sys.argv[1].encode(), type=SchedulerArgs))
    if svc.args.port_file:
        Path(svc.args.port_file).write_text(svc.address)
    try:
        svc.serve_forever()
    except KeyboardInterrupt:
        svc.close()


if __name__ == "__main__":
    main()
