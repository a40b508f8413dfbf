"""The HTTP edge around the routes: access log, metric labels, bounded JSON bodies.

- ``AccessLog``: an ASGI middleware writing one line per request to the ``dualpath.access`` logger
  when its response ends (uvicorn's access-log shape plus the duration):
  ``127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200 0.012s``. Errors are logged by the app
  (``dualpath.server``, one line each; 5xx with the traceback).
- ``endpoint_label``: the route template of a request, or ``"unmatched"`` for paths no route has,
  so random 404 paths never create new Prometheus series.
- ``read_json_body``: refuses a non-JSON content type (415) and stops reading at the size limit
  (413, from ``Content-Length`` at once or while streaming), so an oversized body is never buffered
  whole; a body slower than ``body_timeout_s`` plus 1 s per ``body_min_rate_bytes_per_s`` is a
  408 (and the connection closes). JSON's ``NaN`` / ``Infinity`` extensions are refused like any
  malformed JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dualpath.runtime.server.config import ServerConfig
from dualpath.runtime.server.errors import APIError

access_log = logging.getLogger("dualpath.access")
UNMATCHED = "unmatched"
JSON_TYPES = ("application/json",)


class AccessLog:
    """One ``dualpath.access`` INFO line per HTTP request, written when its response ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            client = scope.get("client")
            who = f"{client[0]}:{client[1]}" if client else "-"
            query = f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else ""
            access_log.info(
                '%s - "%s %s%s HTTP/%s" %d %.3fs',
                who,
                scope["method"],
                scope["path"],
                query,
                scope.get("http_version", "1.1"),
                status[0],
                time.monotonic() - start,
            )


def endpoint_label(request: Request) -> str:
    """The matched route's path template, or ``"unmatched"``."""
    route = request.scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


async def read_json_body(request: Request, config: ServerConfig, metrics: Any = None) -> Any:
    """The parsed JSON body (see module docstring for the refusals)."""
    ctype = request.headers.get("content-type", "")
    media = ctype.split(";", 1)[0].strip().lower()
    if media not in JSON_TYPES:
        raise APIError(
            415,
            f"Content-Type {ctype or '(none)'!r} is not supported; send application/json",
            param="content-type",
            code="unsupported_media_type",
        )
    max_bytes = config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(
            413,
            f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes",
            code="request_too_large",
        )
    chunks = await _read_in_time(request, config, metrics)
    try:
        return json.loads(b"".join(chunks), parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise APIError(400, f"malformed JSON body: {exc}", code="invalid_json") from None
    except ValueError as exc:  # NaN / Infinity
        raise APIError(400, f"malformed JSON body: {exc}", code="invalid_json") from None


async def _read_in_time(request: Request, config: ServerConfig, metrics: Any) -> list[bytes]:
    """The body's chunks, read by a deadline of ``body_timeout_s`` plus one second per
    ``body_min_rate_bytes_per_s`` received (mod_reqtimeout's body rule; 408 when passed) and
    stopped at ``max_request_bytes`` (413)."""
    chunks: list[bytes] = []
    size, start = 0, time.monotonic()
    stream = request.stream().__aiter__()
    while True:
        deadline = start + config.body_timeout_s + size / config.body_min_rate_bytes_per_s
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(deadline - time.monotonic(), 0.0))
        except StopAsyncIteration:
            return chunks
        except TimeoutError:
            if metrics is not None:
                metrics.connections_closed.labels("body_timeout").inc()
            raise APIError(
                408,
                f"request body not received in time: {size} bytes in {time.monotonic() - start:.1f} s "
                f"(the limit is {config.body_timeout_s:g} s plus 1 s per "
                f"{config.body_min_rate_bytes_per_s:g} bytes)",
                code="request_timeout",
            ) from None
        size += len(chunk)
        if size > config.max_request_bytes:
            raise APIError(
                413,
                f"request body exceeds the limit of {config.max_request_bytes} bytes "
                f"(stopped reading at {size})",
                code="request_too_large",
            )
        chunks.append(chunk)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")
