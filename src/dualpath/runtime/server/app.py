"""The OpenAI-compatible HTTP API over a cluster client (FastAPI).

``create_app(cluster, tokenizer, config)``: ``cluster`` is a scheduler address (a ``ClusterClient``
is made inside the server's event loop) or a zero-argument factory returning any object with the
ClusterClient methods (``connect``, ``close``, ``info``, ``health``, ``metrics``, ``generate``,
``end``).
Every failure becomes an OpenAI-style error body; nothing a client sends crashes the server.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dualpath.runtime.cluster.api import ClusterError, ClusterInfo, DownItem
from dualpath.runtime.server.access import AccessLog, endpoint_label, read_json_body
from dualpath.runtime.server.config import ServerConfig
from dualpath.runtime.server.connections import AcceptErrorLog
from dualpath.runtime.server.disconnect import CLIENT_GONE_STATUS, ClientGone, DisconnectWatch, close_detached
from dualpath.runtime.server.errors import APIError, from_cluster_error
from dualpath.runtime.server.generate import Piece, Timing, run_generation
from dualpath.runtime.server.metrics import CONTENT_TYPE, ServerMetrics, count_http
from dualpath.runtime.server.protocol import ApiRequest, parse_request
from dualpath.runtime.server.responses import SSE_DONE, ResponseBuilder, sse
from dualpath.runtime.server.schema import CHAT_SCHEMA, COMPLETION_SCHEMA, request_body
from dualpath.runtime.server.tokenizer import Tokenizer

log = logging.getLogger("dualpath.server")
RETRY_AFTER_S = {429: 1, 503: 5}  # Retry-After of a full queue / an unavailable cluster


class _State:
    def __init__(self, factory: Callable[[], Any], tok: Tokenizer, config: ServerConfig) -> None:
        self.factory = factory
        self.tok = tok
        self.config = config
        self.client: Any = None
        self.info: ClusterInfo | None = None
        self.metrics = ServerMetrics()

    async def cluster_info(self) -> ClusterInfo:
        if self.info is None:
            try:
                self.info = await self.client.info()
            except ClusterError as exc:
                raise from_cluster_error(exc) from None
        return self.info

    def served_name(self, info: ClusterInfo) -> str:
        return self.config.model_name or info.model_name


def _factory(cluster: str | Callable[[], Any], config: ServerConfig) -> Callable[[], Any]:
    if callable(cluster):
        return cluster

    def make() -> Any:
        from dualpath.runtime.cluster.client import ClusterClient
        from dualpath.runtime.transfer.auth import load_keys

        return ClusterClient(
            cluster,
            query_timeout_s=config.cluster_query_timeout_s,
            keys=load_keys(config.cluster_key_file or ""),
            api_key=config.api_key,
        )

    return make


def create_app(
    cluster: str | Callable[[], Any], tokenizer: Tokenizer, config: ServerConfig | None = None
) -> FastAPI:
    """Build the app; the cluster client lives from startup to shutdown of the server."""
    config = config or ServerConfig()
    state = _State(_factory(cluster, config), tokenizer, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        asyncio.get_running_loop().set_exception_handler(AcceptErrorLog(state.metrics))
        state.client = state.factory()
        await state.client.connect()
        try:
            yield
        finally:
            await state.client.close()

    app = FastAPI(title="dualpath", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(AccessLog)
    app.state.dualpath = state
    _add_error_handlers(app, state)
    _add_info_routes(app, state)
    _add_generation_routes(app, state)
    return app


def _retry_headers(status: int) -> dict[str, str]:
    if status == 408:  # the body did not arrive in time: this connection is done
        return {"Connection": "close"}
    return {"Retry-After": str(RETRY_AFTER_S[status])} if status in RETRY_AFTER_S else {}


def _error_response(state: _State, request: Request, exc: APIError) -> JSONResponse:
    """The answer to a refused or failed request: counted under its route, logged once."""
    count_http(state.metrics, endpoint_label(request), exc.status)
    level = logging.ERROR if exc.status >= 500 else logging.WARNING
    log.log(level, "%s %s -> %d %s", request.method, request.url.path, exc.status, exc.message[:500])
    return JSONResponse(exc.body(), status_code=exc.status, headers=_retry_headers(exc.status))


def _add_error_handlers(app: FastAPI, state: _State) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(state, request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return _error_response(state, request, APIError(exc.status_code, msg))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        ref = uuid.uuid4().hex[:12]  # the body says only this; the log has the traceback
        log.error(
            "%s %s: internal error %s",
            request.method,
            request.url.path,
            ref,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        err = APIError(
            500,
            f"internal server error (reference {ref}); the server log has the details",
            code="internal_error",
        )
        return _error_response(state, request, err)


def _check_auth(state: _State, request: Request) -> None:
    key = state.config.api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    given = header[7:] if header.lower().startswith("bearer ") else ""
    if not secrets.compare_digest(given.encode(), key.encode()):
        reason = "missing Authorization: Bearer header" if not given else "incorrect API key"
        raise APIError(401, f"{reason} (this server needs an API key)", code="invalid_api_key")


def _add_info_routes(app: FastAPI, state: _State) -> None:
    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        _check_auth(state, request)
        info = await state.cluster_info()
        count_http(state.metrics, endpoint_label(request), 200)
        return JSONResponse(_models_body(state, info))

    @app.get("/health")
    async def health() -> JSONResponse:
        try:
            h = await state.client.health()
        except ClusterError as exc:
            return _scheduler_unreachable(state, exc)
        body = _health_body(h)
        return JSONResponse(
            body, status_code=200 if h.ok else 503, headers={} if h.ok else _retry_headers(503)
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        try:
            state.metrics.update(await state.client.metrics(), getattr(state.client, "resubmitted", 0))
        except ClusterError:
            state.metrics.update(None, getattr(state.client, "resubmitted", 0))
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)


def _models_body(state: _State, info: Any) -> dict[str, Any]:
    """The OpenAI /v1/models list: the one served model."""
    return {
        "object": "list",
        "data": [
            {
                "id": state.served_name(info),
                "object": "model",
                "created": 0,
                "owned_by": "dualpath",
                "max_model_len": info.max_context_len,
                "vocab_size": info.vocab_size,
            }
        ],
    }


def _scheduler_unreachable(state: _State, exc: ClusterError) -> JSONResponse:
    """/health's 503 when the scheduler did not answer: down since the connection dropped."""
    lost_s = getattr(state.client, "lost_since_s", None)  # (the connection dropped then)
    since = time.time() - (time.monotonic() - lost_s) if lost_s is not None else time.time()
    down = DownItem(what="scheduler", state="dead", since_unix_s=since)
    return JSONResponse(
        {
            "status": "unhealthy",
            "down": ["scheduler"],
            "error": str(exc),
            "unavailable": [_down_item(down)],
        },
        status_code=503,
        headers=_retry_headers(503),
    )


def _health_body(h: Any) -> dict[str, Any]:
    """/health's body from the scheduler's health answer."""
    unavailable = list(getattr(h, "unavailable", ()))
    status = "unhealthy" if not h.ok else "degraded" if unavailable else "ok"
    body = {
        "status": status,
        "down": list(h.down),
        "policy": h.policy,
        "num_waiting": h.num_waiting,
        "num_running": h.num_running,
        "engines": [_engine(e) for e in h.engines],
        "unavailable": [_down_item(d) for d in unavailable],
        "restarts": dict(getattr(h, "restarts", {})),
        "standby": [
            {"pid": s.pid, "warm": s.warm, "rss_bytes": s.rss_bytes} for s in getattr(h, "standby", ())
        ],
    }
    if getattr(h, "reason", ""):
        body["reason"] = h.reason
    return body


def _engine(e: Any) -> dict[str, Any]:
    """One engine: its current process (pid, generation), state, restarts and memory."""
    out = {"engine_id": e.engine_id, "role": e.role, "node_id": e.node_id, "alive": e.alive,
           "num_seqs": e.num_seqs}  # fmt: skip
    if hasattr(e, "state"):
        out |= {
            "state": e.state,
            "pid": e.pid,
            "generation": e.generation,
            "restarts": e.restarts,
            "memory": {
                "weights_bytes": e.weights_bytes,
                "kv_pool_bytes": e.kv_pool_bytes,
                "rss_bytes": e.rss_bytes,
                "max_prompt_tokens": e.max_prompt_tokens,
                "max_context_tokens": e.max_context_tokens,
            },
        }
    return out


def _down_item(d: Any) -> dict[str, Any]:
    """One process down now: what, its state, since when (ISO 8601, UTC) and for how long."""
    since = datetime.fromtimestamp(d.since_unix_s, tz=UTC)
    return {
        "what": d.what,
        "state": d.state,
        "since": since.isoformat(timespec="seconds"),
        "for_s": round(max(time.time() - d.since_unix_s, 0.0), 1),
    }


def _add_generation_routes(app: FastAPI, state: _State) -> None:
    async def handle(kind: str, request: Request) -> Response:
        _check_auth(state, request)
        body = await read_json_body(request, state.config, state.metrics)
        info = await state.cluster_info()
        req = parse_request(
            kind, body, info, state.tok, state.served_name(info), state.config.default_max_tokens
        )
        timing = Timing()
        pieces = run_generation(state.client, req, state.tok, timing, state.config.token_timeout_s)
        watch = DisconnectWatch(request.receive)
        try:
            first = await watch.race(pieces.__anext__())
        except ClusterError as exc:
            watch.close()
            raise from_cluster_error(exc) from None
        except ClientGone:  # (the generation was cancelled: its request is counted cancelled)
            watch.close()
            return Response(status_code=CLIENT_GONE_STATUS)
        if first.finish_reason == "error":  # nothing sent yet: answer with a status
            watch.close()
            await pieces.aclose()  # type: ignore[attr-defined]
            raise APIError(503, f"generation failed: {first.error}", code="generation_failed")
        count_http(state.metrics, endpoint_label(request), 200)
        if req.stream:
            return StreamingResponse(
                _stream(state, req, first, pieces, timing, watch), media_type="text/event-stream"
            )
        try:
            return await _collect(state, req, first, pieces, timing, watch)
        except ClientGone:
            return Response(status_code=CLIENT_GONE_STATUS)
        finally:
            watch.close()

    @app.post("/v1/completions", openapi_extra=request_body(COMPLETION_SCHEMA))
    async def completions(request: Request) -> Response:
        return await handle("completion", request)

    @app.post("/v1/chat/completions", openapi_extra=request_body(CHAT_SCHEMA))
    async def chat_completions(request: Request) -> Response:
        return await handle("chat", request)


async def _collect(
    state: _State,
    req: ApiRequest,
    first: Piece,
    pieces: AsyncIterator[Piece],
    timing: Timing,
    watch: DisconnectWatch,
) -> JSONResponse:
    out = ResponseBuilder(req)
    texts, ids, last = [first.text], list(first.token_ids), first
    try:
        while last.finish_reason is None:
            last = await watch.race(pieces.__anext__())
            texts.append(last.text)
            ids.extend(last.token_ids)
    finally:
        state.metrics.observe_request(timing.token_times_s, len(req.prompt_ids), last.stats)
        await close_detached(pieces, watch)
    if last.finish_reason == "error":
        raise APIError(
            503, f"generation failed after {len(ids)} tokens: {last.error}", code="generation_failed"
        )
    return JSONResponse(out.full("".join(texts), ids, last.finish_reason))


async def _stream(
    state: _State,
    req: ApiRequest,
    first: Piece,
    pieces: AsyncIterator[Piece],
    timing: Timing,
    watch: DisconnectWatch,
) -> AsyncIterator[str]:
    out = ResponseBuilder(req)
    num_ids, last = 0, first
    try:
        if req.kind == "chat":
            yield sse(out.chunk("", [], None, role=True))
        piece: Piece | None = first
        while piece is not None:
            last = piece
            if piece.finish_reason == "error":
                err = APIError(503, f"generation failed: {piece.error}", code="generation_failed")
                yield sse(err.body())
                break
            num_ids += len(piece.token_ids)
            if piece.text or piece.finish_reason is not None or req.return_token_ids:
                yield sse(out.chunk(piece.text, piece.token_ids, piece.finish_reason))
            piece = None if piece.finish_reason is not None else await watch.race(pieces.__anext__())
        if req.include_usage:
            yield sse(out.usage_chunk(num_ids))
        yield SSE_DONE
    except ClientGone:  # (nobody to send to; the generation was cancelled)
        return
    finally:
        state.metrics.observe_request(timing.token_times_s, len(req.prompt_ids), last.stats)
        await close_detached(pieces, watch)
