"""A request's stream through the scheduler, for ``ClusterClient`` (``client.py``): one
submission's events (``_attempt``) and, when the scheduler's connection drops, the request
submitted again to the restarted scheduler with the tokens its caller has (``generate``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING

import msgspec

from dualpath.runtime.cluster.api import (
    ClusterError,
    ClusterHealth,
    ClusterUnavailableError,
    ContextTooLongError,
    QueueFullError,
    SamplingParams,
    TokenEvent,
)
from dualpath.runtime.cluster.messages import Abort, Rejected, Submit

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


class RequestStreams:
    """Needs the client's ``_streams``, ``_send``, ``_check_up``, ``health``, ``_sock``, its
    connection state (``lost_since_s``, ``_lost_at_s``) and settings (``api_key``, ``liveness_s``,
    ``resubmit_s``); counts ``resubmitted``."""

    _streams: dict[str, asyncio.Queue[TokenEvent | Rejected | _Lost]]
    _end_reasons: dict[str, str]
    _active: set[str]
    _sock: object
    lost_since_s: float | None
    lost_reason: str
    _lost_at_s: float
    api_key: str
    liveness_s: float
    resubmit_s: float
    resubmitted: int

    if TYPE_CHECKING:

        async def _send(self, msg: object) -> None: ...

        def _check_up(self) -> None: ...

        async def health(self) -> ClusterHealth: ...

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
        error event. A request made within ``resubmit_s`` of a drop waits the same way for the
        restarted scheduler (and, refused as unavailable meanwhile, tries again) before it is
        refused with ClusterUnavailableError.
        """
        if self.lost_since_s is not None:
            if await self._wait_up(self.lost_reason) is not None:
                self._check_up()  # (raises: no scheduler within resubmit_s of the drop)
        rid = request_id or uuid.uuid4().hex
        self._active.add(rid)
        try:
            async with aclosing(self._resubmitting(rid, prompt_token_ids, params.with_seed())) as evs:
                async for ev in evs:
                    yield ev
        finally:
            self._active.discard(rid)
            self._end_reasons.pop(rid, None)

    async def _resubmitting(
        self, rid: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[TokenEvent, None]:
        """``generate``'s submissions of request ``rid``: the first, then one per scheduler loss."""
        had: list[int] = []
        key, resubmits = rid, 0
        while True:
            try:
                async with aclosing(
                    self._attempt(key, rid, prompt_token_ids, params, had, resubmits > 0)
                ) as evs:
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
                if time.monotonic() >= self._lost_at_s + self.resubmit_s:
                    raise  # (no scheduler restart under way: the HTTP layer answers 503, Retry-After)
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
        self, key: str, rid: str, prompt: list[int], params: SamplingParams, had: list[int], resubmitted: bool
    ) -> AsyncGenerator[TokenEvent, None]:
        """One submission of request ``rid`` under ``key`` (after ``had``): its events; raises
        SchedulerLost when the connection drops, a ClusterError when it is refused. Closed early,
        it aborts the request with the reason ``end`` gave (else "cancelled")."""
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
                reason = self._end_reasons.get(rid, "cancelled")
                try:
                    await self._send(Abort(request_id=key, reason=reason, api_key=self.api_key))  # type: ignore[arg-type]
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
