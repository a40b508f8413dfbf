"""The proxy in front of vLLM P/D instances (as vLLM's disaggregated-serving examples): per request a
prefill request (``max_tokens=1``, ``kv_transfer_params`` naming the read side) to the prefill
instance, then the decode request (the prefill's returned ``kv_transfer_params``) to the decode
instance, both chosen by the router (router.py: ``dualpath.policy``). The decode instance finds
the prompt's whole blocks in the shared store (the prefill's connector saved them): the P -> D KV
transfer goes through the store. No vLLM import.

``POST /v1/completions`` takes vLLM's completion body (``prompt`` a string or token ids); the
answer is the decode instance's, plus ``dualpath``: the route (instances, read side, hit tokens)
and the prefill / decode times. ``GET /metrics``: requests by read side and phase times.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from dualpath.core.errors import DualpathError
from dualpath.integrations.vllm.router import Route, Router


class Proxy:
    """The proxy's state: the router, the requests waiting for a placement, an HTTP client."""

    def __init__(self, router: Router, *, model: str, tokenize: Any, snic: bool = True,
                 timeout_s: float = 600.0) -> None:  # fmt: skip
        self.router, self.model, self.tokenize, self.snic = router, model, tokenize, snic
        self.timeout_s = timeout_s
        self.waiting: dict[str, asyncio.Future[Route]] = {}
        self.client: httpx.AsyncClient | None = None
        self.registry = reg = CollectorRegistry()
        self.requests = Counter(
            "dualpath_proxy_requests", "Requests by read side", ["read_side"], registry=reg
        )
        self.phase = Histogram("dualpath_proxy_phase_seconds", "Prefill and decode request times", ["phase"],
                               registry=reg)  # fmt: skip
        self.routes: list[dict[str, Any]] = []  # every placed request (the demo's read-side counts)

    def _tick(self) -> None:
        for route in self.router.tick(time.monotonic()):
            fut = self.waiting.pop(route.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result(route)

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self.client is not None
        r = await self.client.post(f"{url}/v1/completions", json=body)
        if r.status_code != 200:
            raise HTTPException(502, f"{url}: {r.status_code} {r.text[:500]}")
        return r.json()  # type: ignore[no-any-return]

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        ids: Sequence[int] = prompt if isinstance(prompt, list) else self.tokenize(str(prompt or ""))
        if not ids or not all(isinstance(t, int) for t in ids):
            raise HTTPException(
                422, f"prompt must be a non-empty string or token id list, got {prompt!r:.80}"
            )
        max_tokens = int(body.get("max_tokens") or 16)
        rid = uuid.uuid4().hex
        self.router.submit(rid, ids, max_tokens)
        fut: asyncio.Future[Route] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        self._tick()
        try:
            route = await fut
            self.requests.labels(route.read_side).inc()
            common = {k: v for k, v in body.items() if k not in ("prompt", "kv_transfer_params", "stream")}
            common.update(model=self.model, prompt=list(ids))
            t0 = time.perf_counter()
            pre = await self._post(route.prefill.url, {**common, "max_tokens": 1,
                                                       "kv_transfer_params": route.kv_transfer_params(snic=self.snic)})  # fmt: skip
            t1 = time.perf_counter()
            self.router.prefill_done(rid)
            self._tick()
            out = await self._post(route.decode.url, {**common, "max_tokens": max_tokens,
                                                      "kv_transfer_params": pre.get("kv_transfer_params")})  # fmt: skip
            t2 = time.perf_counter()
        except BaseException:
            self.waiting.pop(rid, None)
            self.router.finished(rid)
            self._tick()
            raise
        self.router.finished(rid)
        self._tick()
        self.phase.labels("prefill").observe(t1 - t0)
        self.phase.labels("decode").observe(t2 - t1)
        info = {"prefill": route.prefill.url, "decode": route.decode.url, "read_side": route.read_side,
                "cached_len": route.cached_len, "prompt_len": len(ids), "prefill_s": t1 - t0,
                "prefill_text": pre["choices"][0].get("text", "") if pre.get("choices") else "",
                "decode_s": t2 - t1}  # fmt: skip
        self.routes.append(info)
        out["dualpath"] = info
        return out


def make_app(proxy: Proxy) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        proxy.client = httpx.AsyncClient(timeout=proxy.timeout_s)
        try:
            yield
        finally:
            await proxy.client.aclose()

    app = FastAPI(title="dualpath vLLM P/D proxy", lifespan=lifespan)

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        body = await request.json()
        if not isinstance(body, dict):
            raise HTTPException(422, "the body must be a JSON object")
        if body.get("stream"):
            raise HTTPException(422, "stream=true is not proxied (the answer comes whole)")
        return await proxy.complete(body)

    @app.post("/configure")
    async def configure(request: Request) -> dict[str, Any]:
        """``{"policy": NAME, "snic": bool}`` between runs (``snic`` false: caps lifted, no-I/O)."""
        body = await request.json()
        try:
            if "policy" in body:
                proxy.router.set_policy(str(body["policy"]))
            if "snic" in body:
                proxy.snic = bool(body["snic"])
        except DualpathError as exc:
            raise HTTPException(422, str(exc)) from None
        return {"policy": proxy.router.policy, "snic": proxy.snic}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(proxy.registry), media_type="text/plain; version=0.0.4")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "policy": proxy.router.policy, "read_queues": proxy.router.read_queues()}

    return app
