"""Connection limits of the HTTP server: request-header deadline, connection cap, fd limit and a
rate-limited log of accept errors. (The body deadline is in ``access.read_json_body``.)

uvicorn bounds the idle time between requests on a kept-alive connection (``timeout_keep_alive``,
measured from the end of a response until the next byte) and the size of a request head (h11's
``max_incomplete_event_size``), but not the time a client may take to send one: a connection that
sends nothing, or a header one byte at a time, is held for ever. ``BoundedH11`` (uvicorn's h11
protocol plus two rules) adds:

- **Header deadline**: from the moment a connection opens (or its previous response ended) the
  whole request head must arrive within ``header_timeout_s``; otherwise the connection is closed
  (with a 408 when part of a request had arrived). A dribble of bytes does not extend it.
- **Connection cap**: at most ``max_connections`` are open. One more closes the connection that has
  waited longest for a request head (a connection with a request in progress is never taken), so
  a flood of idle connections cannot lock out a new client; when every connection has a request in
  progress, the new one gets a 503 (``Retry-After: 1``) and is closed at once.

``raise_fd_limit`` lifts the soft open-file limit to the hard one (the cap then stays under half of
it, leaving the rest to the process's own sockets and files and the supervisor's restarts);
``AcceptErrorLog`` logs asyncio's "socket.accept() out of system resource" once per interval with a
count instead of once per attempt (Python 3.11 retries each accept up to 100 times per loop tick).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from dualpath.runtime.server.config import ServerConfig

log = logging.getLogger("dualpath.server")
ACCEPT_ERROR = "socket.accept() out of system resource"
ACCEPT_LOG_INTERVAL_S = 10.0  # at most one accept-error line per this many seconds
_408 = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
_503 = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit where allowed; returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, want
    return soft, soft


def connection_cap(config: ServerConfig) -> int:
    """``max_connections``, held under half the soft open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = soft // 2 if soft != resource.RLIM_INFINITY else config.max_connections
    return max(1, min(config.max_connections, room))


class ConnectionBook:
    """Open connections and why the server closed some (shared by every connection of a server)."""

    def __init__(self, cap: int, metrics: Any = None) -> None:
        self.cap = cap
        self.metrics = metrics
        self.waiting: OrderedDict[BoundedH11, None] = OrderedDict()  # no request in progress
        self.closed: dict[str, int] = {}

    def close(self, proto: BoundedH11, reason: str, reply: bytes = b"") -> None:
        self.waiting.pop(proto, None)
        self.closed[reason] = self.closed.get(reason, 0) + 1
        if self.metrics is not None:
            self.metrics.connections_closed.labels(reason).inc()
        if reply:
            proto.transport.write(reply)
        proto.transport.close()

    def evict_one(self) -> bool:
        """Close the connection that has waited longest for a request head; False if none."""
        if not self.waiting:
            return False
        victim = next(iter(self.waiting))
        self.close(victim, "evicted_idle")
        return True


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with a request-header deadline and the connection cap (above)."""

    book: ConnectionBook
    header_timeout_s: float

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        if len(self.connections) > self.book.cap and not self.book.evict_one():
            self.book.close(self, "refused_full", _503)
            return
        self._wait_for_head()

    def data_received(self, data: bytes) -> None:
        if self._deadline is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.book.waiting.pop(self, None)
        super().connection_lost(exc)

    def _track(self) -> None:
        """After h11 consumed events: serving a request (no deadline) or waiting for one."""
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._cancel_deadline()
            self.book.waiting.pop(self, None)
        elif self._deadline is None:  # (also a body still arriving after its response was sent)
            self._wait_for_head()

    def _wait_for_head(self) -> None:
        self._head_bytes = 0
        self.book.waiting[self] = None
        self._deadline = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_timed_out(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            started = self._head_bytes > 0 and self.conn.their_state is h11.IDLE
            self.book.close(self, "header_timeout", _408 if started else b"")


def bounded_protocol(config: ServerConfig, metrics: Any = None) -> tuple[type[BoundedH11], ConnectionBook]:
    """A ``BoundedH11`` subclass bound to one server's settings and book (uvicorn's ``http=``)."""
    book = ConnectionBook(connection_cap(config), metrics)
    cls = type("DualpathH11", (BoundedH11,), {"book": book, "header_timeout_s": config.header_timeout_s})
    return cls, book


class AcceptErrorLog:
    """An asyncio exception handler: accept errors (fd exhaustion) are logged at most once per
    ``interval_s`` with the count since the last line; anything else goes to the default handler."""

    def __init__(self, metrics: Any = None, interval_s: float = ACCEPT_LOG_INTERVAL_S) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self.total = 0
        self._unlogged = 0
        self._last_s: float | None = None
        self._flush_due = False

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != ACCEPT_ERROR:
            loop.default_exception_handler(context)
            return
        self.total += 1
        self._unlogged += 1
        if self.metrics is not None:
            self.metrics.accept_errors.inc()
        now = time.monotonic()
        if self._last_s is None or now - self._last_s >= self.interval_s:
            self._flush(str(context.get("exception")))
        elif not self._flush_due:  # the rest of this interval's failures: one line at its end
            self._flush_due = True
            loop.call_later(self._last_s + self.interval_s - now, self._flush, str(context.get("exception")))

    def _flush(self, error: str) -> None:
        self._flush_due = False
        if not self._unlogged:
            return
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        log.error(
            "HTTP accept failed %d time(s)%s: %s (open-file limit %d); new connections wait in "
            "the backlog. Further failures are logged at most every %.0f s "
            "(dualpath_http_accept_errors_total)",
            self._unlogged, "" if self._last_s is None else " since the last such line", error, soft,
            self.interval_s,
        )  # fmt: skip
        self._unlogged, self._last_s = 0, time.monotonic()


def uvicorn_config(app: Any, config: ServerConfig, **kw: Any) -> Any:
    """The ``uvicorn.Config`` of a dualpath server: h11 with ``BoundedH11``, the keep-alive
    timeout and the request-head size limit of ``config``."""
    import uvicorn

    state = getattr(getattr(app, "state", None), "dualpath", None)
    proto, book = bounded_protocol(config, getattr(state, "metrics", None))
    if state is not None:
        state.connections = book
    return uvicorn.Config(
        app,
        http=proto,
        timeout_keep_alive=config.keep_alive_timeout_s,
        h11_max_incomplete_event_size=config.max_header_bytes,
        **kw,
    )
