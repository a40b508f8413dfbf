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
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from dualpath.runtime.cluster.api import (
    ClusterError,
    ClusterHealth,
    ClusterInfo,
    ClusterUnavailableError,
    ContextTooLongError,
    MetricsSnapshot,
    QueueFullError,
    SamplingParams,
    TokenEvent,
)
from dualpath.runtime.cluster.messages import (
    DECODE_ERRORS,
    Abort,
    Configure,
    Query,
    QueryReply,
    Rejected,
    Submit,
    Tokens,
    decode,
    encode,
)
from dualpath.runtime.transfer.auth import ClusterKeys
from dualpath.runtime.transfer.drops import DropCounter

_REJECT_ERRORS: dict[str, type[ClusterError]] = {
    "queue_full": QueueFullError,
    "too_long": ContextTooLongError,
    "unavailable": ClusterUnavailableError,
}


# A request in flight when the scheduler dies is submitted again to the restarted one within
# this long of the drop: the time the scheduler gives requests waiting for a restarted engine
# (supervisor_view.ORPHAN_WAIT_S), the same bound on a restart; measured, a restarted scheduler
# takes requests again within 1-4 s on a loaded 2-core machine (benchmarks/chaos.py).
RESUBMIT_S = 30.0
RESUBMIT_POLL_S = 0.2  # how often a request waiting to be resubmitted looks at the connection
MAX_RESUBMITS = 3  # scheduler losses one request goes through; one more ends it with an error


class _Lost:
    """Put in every open stream's queue when the connection to the scheduler drops."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class SchedulerLost(Exception):
    """The connection to the scheduler dropped while a request was in flight."""


class ClusterClient:
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
        self._streams: dict[str, asyncio.Queue[TokenEvent | Rejected]] = {}
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

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[TokenEvent]:
        """Submit one request and yield its tokens in order; the last event has ``finish_reason``.

        Raises QueueFullError / ContextTooLongError / ClusterUnavailableError if the scheduler
        rejects it before any token, ClusterError on a bad request. An engine failure after tokens
        started arrives as a last event with ``finish_reason == "error"``. Closing the iterator
        early (e.g. the HTTP client went away) aborts the request in the cluster.

        When the connection to the scheduler drops (its process died), the request is submitted
        again, once the restarted scheduler takes requests (within ``resubmit_s``), with the
        tokens yielded so far: generation goes on after them (no token repeated, greedy tokens as
        without the fault; an unseeded sampled request gets its seed here, so it draws the same
        stream). ``MAX_RESUBMITS`` losses, or no scheduler within ``resubmit_s``, end it with an
        error event.
        """
        self._check_up()
        rid = request_id or uuid.uuid4().hex
        params = params.with_seed()
        had: list[int] = []
        key, resubmits = rid, 0
        while True:
            try:
                async with aclosing(self._attempt(key, prompt_token_ids, params, had, resubmits > 0)) as evs:
                    async for ev in evs:
                        had.append(ev.token_id)
                        yield ev if key == rid else msgspec.structs.replace(ev, request_id=rid)
                return
            except SchedulerLost as lost:
                error: str | None = (
                    f"{lost} (resubmitted {resubmits} times already)" if resubmits else str(lost)
                )
                if self.resubmit_s > 0 and resubmits < MAX_RESUBMITS:
                    resubmits += 1
                    self.resubmitted += 1
                    error = await self._wait_up(str(lost))
            except ClusterUnavailableError as exc:  # (refused: no scheduler, or none of its engines)
                if resubmits == 0:
                    raise  # (the first submission: the HTTP layer answers 503 with Retry-After)
                await asyncio.sleep(RESUBMIT_POLL_S)
                error = await self._wait_up(str(exc))
            if error is not None:
                if not had:
                    raise ClusterUnavailableError(error)
                yield TokenEvent(
                    request_id=rid, index=len(had), token_id=-1, finish_reason="error", error=error
                )
                return
            key = uuid.uuid4().hex  # (never a key the dead scheduler's engines may still send)

    async def _wait_up(self, reason: str) -> str | None:
        """Wait until the scheduler's connection is back, at most until ``resubmit_s`` after it
        dropped: None (submit again), or the error to end the request with."""
        deadline = self._lost_at_s + self.resubmit_s
        while self.lost_since_s is not None and time.monotonic() < deadline:
            await asyncio.sleep(RESUBMIT_POLL_S)
        if time.monotonic() >= deadline:
            return f"{reason}; the scheduler took no requests again within {self.resubmit_s:.0f} s"
        return None

    async def _attempt(
        self, key: str, prompt: list[int], params: SamplingParams, had: list[int], resubmitted: bool
    ) -> AsyncIterator[TokenEvent]:
        """One submission under ``key`` (after ``had``): its events; raises SchedulerLost when the
        connection drops, a ClusterError when it is refused."""
        queue: asyncio.Queue[TokenEvent | Rejected | _Lost] = asyncio.Queue()
        self._streams[key] = queue
        finished = False
        try:
            await self._send(Submit(request_id=key, prompt_token_ids=list(prompt), params=params,
                                    api_key=self.api_key, resubmitted=resubmitted, generated=list(had)))  # fmt: skip
            while True:
                item = await self._next(queue)
                if isinstance(item, (_Lost, Rejected)):
                    finished = True
                    if isinstance(item, _Lost):
                        raise SchedulerLost(item.reason)
                    raise _REJECT_ERRORS.get(item.kind, ClusterError)(item.reason)
                finished = item.is_last
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(key, None)
            if not finished and self._sock is not None:
                try:
                    await self._send(Abort(request_id=key, api_key=self.api_key))
                except Exception:
                    pass

    async def _next(
        self, queue: asyncio.Queue[TokenEvent | Rejected | _Lost]
    ) -> TokenEvent | Rejected | _Lost:
        while True:
            try:
                return await asyncio.wait_for(queue.get(), self.liveness_s)
            except TimeoutError:
                try:
                    await self.health()  # raises ClusterUnavailableError if the scheduler is gone
                except ClusterUnavailableError:
                    if self.lost_since_s is None:
                        raise
                    return await queue.get()  # (the drop put a _Lost there)

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
