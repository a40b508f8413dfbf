"""Issue 13, HTTP: schemathesis generates requests from the real server's OpenAPI document (typed
request bodies, runtime/server/schema.py), valid ones and invalid ones, against the real server
over a real local cluster (the package's ``rig``); no answer may be a 5xx. Slow: ``pytest -m slow``.

(schemathesis' own pytest plugin does not run under this pytest; its strategies drive hypothesis
here directly.)"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the test extra")

MAX_TOKENS = 16  # generated max_tokens above this are lowered (long generations only cost time)
OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("GET", "/metrics"),
]


def _cap(body: Any) -> Any:
    if (
        isinstance(body, dict)
        and type(body.get("max_tokens")) is int
        and MAX_TOKENS < body["max_tokens"] < 4096
    ):
        body["max_tokens"] = MAX_TOKENS
    return body


CASES = [(m, p, "positive") for m, p in OPERATIONS] + [
    (m, p, "negative") for m, p in OPERATIONS if m == "POST"
]  # (the GETs take no input)


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path", "mode"), CASES, ids=[" ".join(c) for c in CASES])
def test_no_generated_request_gets_a_5xx(rig: Any, method: str, path: str, mode: str) -> None:
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(rig.url + "/openapi.json")
    ops = {(o.method.upper(), o.path): o for o in (r.ok() for r in schema.get_all_operations())}
    assert (method, path) in ops, sorted(ops)
    statuses: dict[int, int] = {}

    @given(case=ops[(method, path)].as_strategy(generation_mode=GenerationMode(mode)))
    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: Any) -> None:
        if method == "POST":
            case.body = _cap(case.body)
        r = case.call(base_url=rig.url, timeout=120)  # (schemathesis serializes what it made)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (case.as_curl_command(), r.status_code, r.text[:500])

    check()
    if method == "POST" and mode == "positive":
        assert statuses.get(200, 0) >= 1, statuses  # (meaningful bodies: some are answered)
    rig.assert_serving()
