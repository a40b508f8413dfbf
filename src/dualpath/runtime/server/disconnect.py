"""Noticing that an HTTP client went away while its request is still being generated.

Neither FastAPI nor Starlette cancels a handler when its client disconnects: a non-streaming
request would run to its last token, and with ASGI 2.4 (uvicorn) a streaming response notices only
when it next sends, so a request waiting for its first token (queued, or behind a long prefill)
would not notice at all. :class:`DisconnectWatch` listens for the ASGI ``http.disconnect`` message
once the body has been read, and :meth:`DisconnectWatch.race` waits for a step of the generation or
the disconnect, whichever comes first; on a disconnect it cancels the step (the cluster stream's
``finally`` sends its ``Abort``, counted "cancelled") and raises :class:`ClientGone`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

CLIENT_GONE_STATUS = 499  # nginx's "client closed request": what the access log shows for one


class ClientGone(Exception):
    """The HTTP client disconnected before its answer was complete."""


class DisconnectWatch:
    """Started after the request body was read (the next ASGI message is the disconnect)."""

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self._task = asyncio.ensure_future(self._listen(receive))
        self.pending: asyncio.Future[Any] | None = None  # a step still running (its task cancelled)

    @staticmethod
    async def _listen(receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # noqa: BLE001 - a server whose receive fails: never report a disconnect
            await asyncio.Event().wait()

    @property
    def gone(self) -> bool:
        return self._task.done() and not self._task.cancelled()

    async def race(self, step: Awaitable[T]) -> T:
        """``step``'s result, unless the client disconnects first: then ``step`` is cancelled
        (and awaited, so its clean-up has run) and ClientGone raised."""
        fut = self.pending = asyncio.ensure_future(step)
        if not self.gone:
            try:
                await asyncio.wait({fut, self._task}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # (the server cancelled the response: see close_detached)
                fut.cancel()
                raise
        if fut.done():
            self.pending = None
            return fut.result()
        fut.cancel()
        with contextlib.suppress(BaseException):
            await fut
        self.pending = None
        raise ClientGone

    def close(self) -> None:
        self._task.cancel()


_CLOSING: set[asyncio.Task[None]] = set()  # (references to running closes)


async def _close(pieces: AsyncIterator[Any], step: asyncio.Future[Any] | None) -> None:
    if step is not None:  # the generator is running in ``step`` (cancelled): let it finish first
        with contextlib.suppress(BaseException):
            await step
    await pieces.aclose()  # type: ignore[attr-defined]


async def close_detached(pieces: AsyncIterator[Any], watch: DisconnectWatch) -> None:
    """Close the generation ``pieces`` (its cluster stream sends the ``Abort``) in a task of its own,
    so that a response the server cancels (Starlette's disconnect listener cancels a streaming
    response's task group, re-cancelling every await in it) still closes it to the end."""
    watch.close()
    task = asyncio.ensure_future(_close(pieces, watch.pending))
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)
    await asyncio.shield(task)
