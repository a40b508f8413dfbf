"""The OpenAPI document states what the server accepts (issue 30, item 9): a body the request
schema admits is not refused for a rule the schema could state, and one it refuses the server
refuses too (before: ``stream_options`` without ``stream`` was schema-valid, then a 400). Each
body goes to the real server (fake cluster) and through the schema it publishes."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the test extra")

USAGE = {"include_usage": True}
BODIES = [
    {"stream_options": USAGE},
    {"stream": False, "stream_options": USAGE},
    {"stream": True, "stream_options": USAGE},
    {"stream": True, "stream_options": {}},
    {"stream_options": None},
    {"stream": False, "stream_options": None},
    {"stream": True},
    {},
]
KINDS = {
    "/v1/completions": ({"prompt": "hi", "max_tokens": 2}, "completions"),
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, "chat"),
}


def _schema(url: str, path: str) -> dict[str, Any]:
    doc = httpx.get(url + "/openapi.json", timeout=10).json()
    return doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


@pytest.mark.parametrize("path", sorted(KINDS))
@pytest.mark.parametrize("extra", BODIES, ids=[str(b) for b in BODIES])
def test_schema_and_server_agree_on_stream_options(served, path: str, extra: dict[str, Any]) -> None:
    base, _ = KINDS[path]
    body = {**base, "model": "tiny", **extra}
    valid = jsonschema.Draft202012Validator(_schema(served.url, path)).is_valid(body)
    r = httpx.post(served.url + path, json=body, timeout=30)
    refused = r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
    assert valid != refused, (body, valid, r.status_code, r.text[:300])
    assert valid == (r.status_code == 200), (body, r.status_code)
