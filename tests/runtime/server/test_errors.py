"""Bad requests get 4xx with an OpenAI error body naming the field; nothing crashes the server."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from dualpath.runtime.server import ServerConfig

OK = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

# (path, body, status, words the message must contain)
BATTERY = [
    ("/v1/completions", b"{not json", 400, ["malformed JSON"]),
    ("/v1/completions", b"[1, 2]", 400, ["JSON object", "list"]),
    ("/v1/completions", {**OK, "model": "gpt-9"}, 404, ["gpt-9", "tiny"]),
    ("/v1/completions", {**OK, "model": 3}, 400, ["model=3"]),
    ("/v1/completions", {**OK, "temperature": -1}, 400, ["temperature=-1"]),
    ("/v1/completions", {**OK, "temperature": "hot"}, 400, ["temperature='hot'"]),
    ("/v1/completions", {**OK, "top_p": 0}, 400, ["top_p=0"]),
    ("/v1/completions", {**OK, "max_tokens": 0}, 400, ["max_tokens=0", ">= 1"]),
    ("/v1/completions", {**OK, "max_tokens": 2.5}, 400, ["max_tokens=2.5", "integer"]),
    ("/v1/completions", {**OK, "max_tokens": True}, 400, ["max_tokens=True"]),
    ("/v1/completions", {**OK, "n": 2}, 400, ["n=2", "n=1"]),
    ("/v1/completions", {**OK, "best_of": 3}, 400, ["best_of=3"]),
    ("/v1/completions", {**OK, "logprobs": 5}, 400, ["logprobs=5"]),
    ("/v1/completions", {**OK, "echo": True}, 400, ["echo=True"]),
    ("/v1/completions", {**OK, "stream": "yes"}, 400, ["stream='yes'"]),
    ("/v1/completions", {**OK, "stream_options": {"include_usage": True}}, 400, ["stream_options"]),
    ("/v1/completions", {**OK, "seed": "x"}, 400, ["seed='x'"]),
    ("/v1/completions", {**OK, "stop": [1]}, 400, ["stop=[1]"]),
    ("/v1/completions", {**OK, "min_tokens": 1}, 400, ["min_tokens=1"]),
    ("/v1/completions", {**OK, "min_tokens": 9}, 400, ["min_tokens=9", "max_tokens"]),
    ("/v1/completions", {**OK, "prompt": [1, 999]}, 400, ["prompt=999", "[0, 256)"]),
    ("/v1/completions", {**OK, "prompt": [-1]}, 400, ["prompt=-1"]),
    ("/v1/completions", {**OK, "prompt": ["a", "b"]}, 400, ["prompt", "batches"]),
    ("/v1/completions", {**OK, "prompt": ""}, 400, ["prompt", "empty"]),
    ("/v1/completions", {**OK, "prompt": None}, 400, ["prompt=None"]),
    ("/v1/completions", {**OK, "prompt": "x" * 600}, 400, ["maximum context length is 512", "600"]),
    ("/v1/completions", {**OK, "max_tokens": 600}, 400, ["max_tokens=600", "512"]),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, ["messages=[]"]),
    ("/v1/chat/completions", {**CHAT, "messages": "hi"}, 400, ["messages='hi'"]),
    (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "wizard", "content": "x"}]},
        400,
        ["messages[0].role='wizard'"],
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": 5}]},
        400,
        ["messages[0].content=5"],
    ),
    (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
        400,
        ["messages[0].content", "text parts"],
    ),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, ["tools="]),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, 400, ["response_format"]),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -3}, 400, ["max_completion_tokens=-3"]),
    ("/v1/nothing", OK, 404, ["/v1/nothing"]),
]


def test_bad_request_battery_then_server_still_works(served) -> None:
    with httpx.Client(base_url=served.url, timeout=10) as http:
        for path, body, status, words in BATTERY:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = http.post(path, content=content, headers={"content-type": "application/json"})
            assert r.status_code == status, (path, body, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}
            for word in words:
                assert word in err["message"], (body, err["message"])
        r = http.get("/v1/completions")
        assert r.status_code == 405 and "GET" in r.json()["error"]["message"]
        r = http.post("/v1/completions", json=OK)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert served.fake.submitted and len(served.fake.submitted) == 1


def test_param_names_the_field(served) -> None:
    r = httpx.post(served.url + "/v1/completions", json={**OK, "temperature": -1})
    assert r.json()["error"]["param"] == "temperature"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_full_queue_is_429(served) -> None:
    served.fake.queue_full = True
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.RateLimitError) as exc:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert exc.value.status_code == 429
    assert "queue is full" in str(exc.value)
    r = httpx.post(served.url + "/v1/completions", json={**OK, "stream": True})
    assert r.status_code == 429  # refused before the stream starts: a status, not an SSE event


def test_api_key(make_served) -> None:
    srv = make_served(ServerConfig(api_key="s3cret"))
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny", prompt="hi", max_tokens=2)
    r = httpx.post(srv.url + "/v1/completions", json=OK)
    assert r.status_code == 401 and "missing" in r.json()["error"]["message"]
    assert httpx.get(srv.url + "/v1/models").status_code == 401
    good = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
    assert good.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    assert httpx.get(srv.url + "/health").status_code == 200  # probes need no key


def test_failure_after_tokens_started(served) -> None:
    served.fake.fail_after = 2
    r = httpx.post(served.url + "/v1/completions", json={**OK, "max_tokens": 5})
    assert r.status_code == 503 and "decode engine 1 died" in r.json()["error"]["message"]
    with httpx.stream(
        "POST", served.url + "/v1/completions", json={**OK, "max_tokens": 5, "stream": True}
    ) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert r.status_code == 200
    assert "decode engine 1 died" in lines[-2] and lines[-1] == "data: [DONE]"


def test_client_disconnect_aborts_the_request(make_served) -> None:
    srv = make_served(token_delay_s=0.05)
    with httpx.stream(
        "POST", srv.url + "/v1/completions", json={**OK, "max_tokens": 200, "stream": True}
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break
    import time

    deadline = time.monotonic() + 5
    while not srv.fake.aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(srv.fake.aborted) == 1


def _wait_aborted(fake, n: int = 1) -> None:
    import time

    deadline = time.monotonic() + 5
    while len(fake.aborted) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(fake.aborted) == n and not fake.end_reasons  # (closed as "cancelled")


def test_client_disconnect_aborts_a_non_streaming_request(make_served) -> None:
    """Before: a non-streaming request ran to its last token after its client left."""
    srv = make_served(token_delay_s=0.05)
    body = {**OK, "max_tokens": 400}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", json=body, timeout=httpx.Timeout(5.0, read=0.5))
    _wait_aborted(srv.fake)  # (400 tokens take 20 s)


def test_client_gone_before_the_first_token_aborts(make_served) -> None:
    """Before: a stream noticed its client's disconnect only when it next sent, so one still
    waiting for its first token (queued, or behind a long prefill) never did."""
    srv = make_served(token_delay_s=30.0)  # the first token would come after 30 s
    body = {**OK, "max_tokens": 4, "stream": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(srv.url + "/v1/completions", json=body, timeout=httpx.Timeout(5.0, read=0.5))
    _wait_aborted(srv.fake)


def test_failure_before_first_token_is_a_status_even_when_streaming(served) -> None:
    served.fake.fail_after = 0
    r = httpx.post(served.url + "/v1/completions", json={**OK, "stream": True})
    assert r.status_code == 503 and "decode engine 1 died" in r.json()["error"]["message"]


def test_no_scheduler_behind_a_real_cluster_client() -> None:
    import socket

    from dualpath.runtime.server import BackgroundServer, CharTokenizer, create_app

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(f"tcp://127.0.0.1:{port}", CharTokenizer(), ServerConfig(cluster_query_timeout_s=0.3))
    with BackgroundServer(app) as srv:
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503 and r.json()["down"] == ["scheduler"]
        r = httpx.post(srv.url + "/v1/completions", json=OK)
        assert r.status_code == 503 and "did not answer" in r.json()["error"]["message"]
        assert "dualpath_cluster_up 0.0" in httpx.get(srv.url + "/metrics").text
