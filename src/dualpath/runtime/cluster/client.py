"""Asyncio client of the scheduler service: what the HTTP layer and the demo use.

One DEALER socket to the scheduler's ROUTER; a background task routes incoming messages to one
asyncio.Queue per request (token events) or per query (health / metrics / info). Use from one event
loop; ``async with ClusterClient(addr) as c`` connects and closes.

A monitor of the socket sees the connection to the scheduler drop (its process died): every
pending query raises ClusterUnavailableError, and so do new requests and queries until the
connection is back (a restarted scheduler); nothing waits for a timeout. Every request in flight
is submitted again to the restarted scheduler with the tokens its caller has (``generate``), or,
when none takes it within ``resubmit_s``, ends with an error event.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from dualpath.runtime.cluster.api import (
    ClusterError,
    ClusterHealth,
    ClusterInfo,
    ClusterUnavailableError,
    MetricsSnapshot,
    TokenEvent,
)
from dualpath.runtime.cluster.client_requests import RESUBMIT_S, RequestStreams, _Lost
from dualpath.runtime.cluster.messages import (
    DECODE_ERRORS,
    Configure,
    Query,
    QueryReply,
    Rejected,
    Tokens,
    decode,
    encode,
)
from dualpath.runtime.transfer.auth import ClusterKeys
from dualpath.runtime.transfer.drops import DropCounter


class ClusterClient(RequestStreams):
    """Talks to the scheduler at ``address`` (e.g. "tcp://127.0.0.1:5557")."""

    def __init__(
        self,
        address: str,
        *,
        query_timeout_s: float = 5.0,
        liveness_s: float = 10.0,
        keys: ClusterKeys | None = None,
        api_key: str | None = None,
        resubmit_s: float = RESUBMIT_S,
    ) -> None:
        """``liveness_s``: while a request waits longer than this for its next event, the client
        asks the scheduler for health; no answer within ``query_timeout_s`` raises
        ClusterUnavailableError (so a dead scheduler never leaves a request hanging). ``keys``:
        the cluster's CURVE keys when it is authenticated (``LocalCluster.keys``). ``api_key``:
        sent with every request, abort and settings change (a cluster with an API key needs it).
        ``resubmit_s``: how long after the scheduler's connection dropped a request in flight may
        be submitted again to the restarted scheduler (``generate``; 0: never, it fails)."""
        self.address = address
        self.api_key = api_key or ""
        self.keys = keys
        self.query_timeout_s = query_timeout_s
        self.liveness_s = liveness_s
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._recv_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self.lost_since_s: float | None = None  # monotonic time the connection dropped (None: up)
        self.lost_reason = ""
        self._streams: dict[str, asyncio.Queue[TokenEvent | Rejected | _Lost]] = {}
        self._end_reasons: dict[str, str] = {}  # request id -> the reason its Abort will give
        self._active: set[str] = set()  # ids of the requests ``generate`` is streaming
        self._queries: dict[int, asyncio.Future[QueryReply]] = {}
        self._query_ids = itertools.count(1)
        self.resubmit_s = resubmit_s
        self.resubmitted = 0  # requests submitted again after the scheduler's connection dropped
        self._lost_at_s = float("-inf")  # monotonic time of the last drop
        self.drops = DropCounter("cluster client")  # scheduler replies that failed validation

    async def connect(self) -> ClusterClient:
        """Open the socket and start the receive task (idempotent)."""
        if self._sock is None:
            self._ctx = zmq.asyncio.Context()
            self._sock = self._ctx.socket(zmq.DEALER)
            self._sock.setsockopt(zmq.LINGER, 0)
            if self.keys is not None:
                self.keys.client(self._sock)
            self._monitor = self._sock.get_monitor_socket(  # type: ignore[assignment]
                zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
            )
            self._sock.connect(self.address)
            loop = asyncio.get_running_loop()
            self._recv_task = loop.create_task(self._recv_loop())
            self._watch_task = loop.create_task(self._watch())
        return self

    async def close(self) -> None:
        for task in (self._recv_task, self._watch_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        if self._sock is not None:
            if self._monitor is not None:
                self._sock.disable_monitor()
                self._monitor.close(0)
            self._sock.close(0)
        if self._ctx is not None:
            self._ctx.term()
        self._sock = self._ctx = self._recv_task = self._watch_task = self._monitor = None

    async def _watch(self) -> None:
        """Connection events: a drop ends every stream and query now; a (re)connection, after the
        CURVE handshake when authenticated, makes the client usable again."""
        assert self._monitor is not None
        up = zmq.EVENT_HANDSHAKE_SUCCEEDED if self.keys is not None else zmq.EVENT_CONNECTED
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._lost(f"lost the connection to the scheduler at {self.address}")
            elif event in (up, zmq.EVENT_HANDSHAKE_SUCCEEDED):
                self.lost_since_s, self.lost_reason = None, ""

    def _lost(self, reason: str) -> None:
        if self.lost_since_s is None:
            self.lost_since_s, self.lost_reason = time.monotonic(), reason
            self._lost_at_s = self.lost_since_s
        for q in self._streams.values():
            q.put_nowait(_Lost(reason))
        queries, self._queries = self._queries, {}
        for fut in queries.values():
            if not fut.done():
                fut.set_exception(ClusterUnavailableError(reason))

    def _check_up(self) -> None:
        if self.lost_since_s is not None:
            raise ClusterUnavailableError(
                f"{self.lost_reason} {time.monotonic() - self.lost_since_s:.1f} s ago"
            )

    async def __aenter__(self) -> ClusterClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _recv_loop(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart()
            try:
                msg = decode(frames[-1])
            except DECODE_ERRORS as exc:  # never end the receive task: every request would hang
                self.drops.drop("control", "invalid", str(exc))
                continue
            if isinstance(msg, Tokens):
                for ev in msg.events:
                    q = self._streams.get(ev.request_id)
                    if q is not None:
                        q.put_nowait(ev)
            elif isinstance(msg, Rejected):
                q = self._streams.get(msg.request_id)
                if q is not None:
                    q.put_nowait(msg)
            elif isinstance(msg, QueryReply):
                fut = self._queries.pop(msg.query_id, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)

    async def _send(self, msg: object) -> None:
        if self._sock is None:
            await self.connect()
        assert self._sock is not None
        await self._sock.send_multipart([b"", encode(msg)])  # type: ignore[arg-type]

    def end(self, request_id: str, reason: str) -> None:
        """Say why the stream of ``request_id`` is about to be closed early: "stop" (the caller
        has what it wanted, e.g. a stop string matched: the cluster counts it finished) or
        "failed" (the caller gave up on the cluster: counted failed). Without it, closing early
        counts the request cancelled (its client went away)."""
        if reason not in ("stop", "failed", "cancelled"):
            raise ValueError(f"end reason {reason!r}: choices are stop, failed, cancelled")
        if request_id in self._active:
            self._end_reasons[request_id] = reason

    async def _query(self, what: str, msg: object = None) -> QueryReply:
        self._check_up()
        qid = next(self._query_ids)
        fut: asyncio.Future[QueryReply] = asyncio.get_running_loop().create_future()
        self._queries[qid] = fut
        await self._send(Query(query_id=qid, what=what) if msg is None else msg(qid))  # type: ignore[operator]
        try:
            return await asyncio.wait_for(fut, self.query_timeout_s)
        except TimeoutError:
            self._queries.pop(qid, None)
            raise ClusterUnavailableError(
                f"scheduler at {self.address} did not answer a {what} query within {self.query_timeout_s} s"
            ) from None

    async def health(self) -> ClusterHealth:
        reply = await self._query("health")
        assert reply.health is not None
        return reply.health

    async def metrics(self) -> MetricsSnapshot:
        reply = await self._query("metrics")
        assert reply.metrics is not None
        return reply.metrics

    async def info(self) -> ClusterInfo:
        reply = await self._query("info")
        assert reply.info is not None
        return reply.info

    async def configure(
        self,
        policy: str | None = None,
        read_free: bool | None = None,
        snic_gbps: float | None = None,
        reset: tuple[str, ...] = (),
    ) -> ClusterHealth:
        """Change operator settings for later requests: the scheduling policy, ``read_free`` (the
        Oracle), ``snic_gbps`` (the emulated storage-NIC cap of every node). None keeps a setting;
        ``reset`` names settings to return to their defaults ("policy", "read_free", "snic_gbps":
        dualpath, False, uncapped). The scheduler keeps them across its restarts and gives them
        to restarted engines.

        Only while no request is in flight; raises ClusterError otherwise or for an unknown policy.
        """
        reply = await self._query(
            "configure",
            lambda qid: Configure(
                query_id=qid,
                policy=policy,
                read_free=read_free,
                snic_gbps=snic_gbps,
                reset=tuple(reset),  # type: ignore[arg-type]
                api_key=self.api_key,
            ),
        )
        if reply.error:
            raise ClusterError(reply.error)
        assert reply.health is not None
        return reply.health
