"""Issue 13, HTTP: schemathesis generates requests from the real server's OpenAPI document (typed
request bodies, runtime/server/schema.py), valid and invalid, against the real server over a real
local cluster (the package's ``rig``); no answer may be a 5xx. Slow: ``pytest -m slow``."""

from __future__ import annotations

from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the test extra")
from hypothesis import HealthCheck, settings  # noqa: E402

MAX_TOKENS = 16  # generated max_tokens above this are lowered (long generations only cost time)


@pytest.fixture(scope="module")
def api_schema(rig: Any) -> Any:
    schema = schemathesis.openapi.from_url(rig.url + "/openapi.json")
    schema.config.base_url = rig.url
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


def _cap(body: Any) -> Any:
    if isinstance(body, dict) and type(body.get("max_tokens")) is int and MAX_TOKENS < body["max_tokens"] < 4096:
        body["max_tokens"] = MAX_TOKENS
    return body


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_5xx(case: Any, rig: Any) -> None:
    case.body = _cap(case.body)
    response = case.call(base_url=rig.url, timeout=120)
    assert response.status_code < 500, (case.as_curl_command(), response.status_code, response.text[:500])
