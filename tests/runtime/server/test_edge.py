"""The request edge: poison values are 400s naming the field, the HTTP rules of issue 13 hold, and
no generated body gets a 5xx (against the in-process stand-in cluster)."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath.runtime.server import ServerConfig

OK = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
JSON = {"content-type": "application/json"}

# (body, param the 400 names, words of the message)
POISON = [
    ('{"model": "tiny", "prompt": "hi", "temperature": 1e400}', "temperature", ["finite"]),  # -> inf
    ({**OK, "temperature": 2.5}, "temperature", ["[0.0, 2.0]"]),
    ({**OK, "top_p": 5e-324, "temperature": 1.0}, None, []),  # accepted: keeps the top token
    ({**OK, "top_p": 0.0}, "top_p", ["(0.0, 1.0]"]),
    ({**OK, "top_p": 1.5}, "top_p", ["(0.0, 1.0]"]),
    ({**OK, "seed": 2**70}, "seed", ["64-bit"]),
    ({**OK, "seed": -(2**63) - 1}, "seed", ["64-bit"]),
    ({**OK, "seed": 1.5}, "seed", ["integer"]),
    ({**OK, "stop_token_ids": [2**70]}, "stop_token_ids", ["out of range"]),
    ({**OK, "stop_token_ids": [-1]}, "stop_token_ids", ["out of range"]),
    ({**OK, "stop_token_ids": [1] * 65}, "stop_token_ids", ["at most 64"]),
    ({**OK, "stop_token_ids": [True]}, "stop_token_ids", ["integers"]),
    ({**OK, "max_tokens": 2**70}, "max_tokens", ["maximum context length"]),
    ({**OK, "min_tokens": 2**70}, "min_tokens", ["<= max_tokens"]),
    ({**OK, "top_k": 40}, "top_k", ["not supported"]),
    ({**OK, "min_p": 0.1}, "min_p", ["not supported"]),
    ({**OK, "presence_penalty": 0.5}, "presence_penalty", ["not supported"]),
    ({**OK, "n": 2**70}, "n", ["n=1"]),
    ({**OK, "prompt": [2**70]}, "prompt", ["out of range"]),
]


def _post(
    url: str, body: object, path: str = "/v1/completions", headers: dict | None = None
) -> httpx.Response:
    raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(url + path, content=raw, headers=headers or JSON, timeout=10)


@pytest.mark.parametrize(("body", "param", "words"), POISON)
def test_poison_values_are_400_naming_the_field(served, body, param, words) -> None:
    r = _post(served.url, body)
    if param is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert all(w in err["message"] for w in words), err["message"]


def test_tiny_temperatures_are_greedy_and_small_ones_raised_to_the_floor(served) -> None:
    for t, used in ((1e-39, 0.0), (5e-324, 0.0), (9e-6, 0.0), (1e-5, 1e-2), (5e-3, 1e-2), (0.5, 0.5)):
        assert _post(served.url, {**OK, "temperature": t}).status_code == 200
        assert served.fake.submitted[-1][1].temperature == used, t


def test_nan_and_infinity_literals_are_malformed_json(served) -> None:
    for lit in ("NaN", "Infinity", "-Infinity"):
        r = _post(served.url, f'{{"model": "tiny", "prompt": "hi", "temperature": {lit}}}')
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], lit


def test_lone_surrogates_are_400_naming_the_field(served) -> None:
    raw = '{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    r = _post(served.url, raw, "/v1/chat/completions")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[0].content" and "surrogate" in err["message"]
    r = _post(served.url, '{"model": "tiny", "prompt": "\\udfff", "max_tokens": 2}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = _post(served.url, '{"model": "tiny", "prompt": "hi", "\\ud800": 1}')
    assert r.status_code == 400 and "body key" in r.json()["error"]["param"]
    assert _post(served.url, CHAT, "/v1/chat/completions").status_code == 200  # still serving


def test_retry_after_on_429_and_503(served) -> None:
    served.fake.queue_full = True
    r = _post(served.url, OK)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    served.fake.queue_full = False
    served.fake.unavailable = True
    r = _post(served.url, OK)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert httpx.get(served.url + "/health").headers["retry-after"] == "5"
    served.fake.unavailable = False
    served.fake.engine_down = True
    r = httpx.get(served.url + "/health")
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    served.fake.engine_down = False
    assert "retry-after" not in httpx.get(served.url + "/health").headers


def test_body_limit_is_enforced_while_reading(make_served) -> None:
    srv = make_served(ServerConfig(max_request_bytes=4096))
    sent = []

    def chunks():  # no Content-Length: the server must stop reading on its own
        for _ in range(1000):
            sent.append(1)
            yield b" " * 1024

    r = httpx.post(srv.url + "/v1/completions", content=chunks(), headers=JSON, timeout=30)
    assert r.status_code == 413 and "stopped reading" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/completions", content=b"{" + b" " * 5000 + b"}", headers=JSON)
    assert r.status_code == 413 and "5002 bytes" in r.json()["error"]["message"]  # Content-Length
    assert _post(srv.url, OK).status_code == 200


def test_only_json_bodies_are_accepted(served) -> None:
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""):
        headers = {"content-type": ctype} if ctype else {}
        r = httpx.post(served.url + "/v1/completions", content=json.dumps(OK), headers=headers)
        assert r.status_code == 415, (ctype, r.text)
        assert r.json()["error"]["code"] == "unsupported_media_type"
    r = _post(served.url, OK, headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200
    assert not served.fake.submitted[:-1]  # none of the refused bodies reached the cluster


def test_unmatched_paths_share_one_metric_label(served) -> None:
    for i in range(20):
        assert httpx.get(f"{served.url}/random/{i}").status_code == 404
    assert _post(served.url, OK).status_code == 200
    text = httpx.get(served.url + "/metrics").text
    lines = [ln for ln in text.splitlines() if ln.startswith("dualpath_http_requests_total")]
    assert 'dualpath_http_requests_total{endpoint="unmatched",status="404"} 20.0' in lines
    assert any('endpoint="/v1/completions",status="200"' in ln for ln in lines)
    assert not any("/random/" in ln for ln in lines)


def test_internal_errors_carry_no_internals_and_are_logged(served, caplog) -> None:
    async def boom(*args: object, **kw: object):  # type: ignore[no-untyped-def]
        raise RuntimeError("secret detail at /srv/internal/path.py")
        yield  # (unreachable: makes this an async generator)

    served.fake.generate = boom
    with caplog.at_level(logging.INFO):
        r = _post(served.url, OK)
    assert r.status_code == 500
    msg = r.json()["error"]["message"]
    assert "secret" not in msg and "RuntimeError" not in msg and "reference" in msg
    ref = msg.split("reference ")[1].split(")")[0]
    errors = [rec for rec in caplog.records if rec.name == "dualpath.server" and ref in rec.getMessage()]
    assert errors and errors[0].exc_info is not None  # the traceback is in the log


def test_one_access_line_per_request_and_a_line_per_error(served, caplog) -> None:
    with caplog.at_level(logging.INFO):
        _post(served.url, OK)
        _post(served.url, {**OK, "temperature": -1})
        with httpx.stream("POST", served.url + "/v1/completions", json={**OK, "stream": True}) as r:
            list(r.iter_lines())
        httpx.get(served.url + "/nothing")
        # a line is written when the server's response ends, which may be just after the client
        # has read it: wait for the server's thread (bounded), then compare without order
        deadline = time.monotonic() + 10.0
        while len(_lines(caplog, "dualpath.access")) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    access = _lines(caplog, "dualpath.access")
    assert len(access) == 4, access
    kinds = sorted(line.split('"', 2)[1] + line.split('"', 2)[2].split()[0] for line in access)
    assert kinds == sorted(["POST /v1/completions HTTP/1.1200", "POST /v1/completions HTTP/1.1400",
                            "POST /v1/completions HTTP/1.1200", "GET /nothing HTTP/1.1404"]), access  # fmt: skip
    errors = _lines(caplog, "dualpath.server")
    assert len(errors) == 2, errors
    assert any("temperature=-1" in e for e in errors) and any("404" in e for e in errors), errors


def _lines(caplog, logger: str) -> list[str]:
    return [rec.getMessage() for rec in caplog.records if rec.name == logger]


_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_FIELDS = [
    "temperature",
    "top_p",
    "seed",
    "max_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "n",
    "stream",
    "ignore_eos",
    "prompt",
    "logprobs",
    "top_k",
    "stream_options",
    "model",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fields=st.dictionaries(
        st.sampled_from(_FIELDS), _json_leaf | st.lists(_json_leaf, max_size=4), max_size=6
    )
)
def test_no_generated_body_gets_a_5xx(served, fields) -> None:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, **fields}
    r = _post(served.url, body)
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_openapi_states_typed_request_bodies(served) -> None:
    spec = httpx.get(served.url + "/openapi.json").json()
    for path, field in (("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")):
        schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        props = schema["properties"]
        assert field in schema["required"]
        assert props["temperature"]["maximum"] == 2.0 and props["top_p"]["exclusiveMinimum"] == 0
        assert props["seed"]["maximum"] >= 9.2e18 and props["stop_token_ids"]["maxItems"] == 64
