"""Connection limits of the HTTP server (issue 30, item 4): header, body and keep-alive deadlines,
the connection cap, the open-file limit, a rate-limited accept-error log. Against the real uvicorn
server as ``dualpath serve`` configures it (``BackgroundServer`` uses the same ``uvicorn_config``),
over the in-process fake cluster; the same on a real ``dualpath serve`` is in
tests/runtime/faults/test_serve_limits.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from dualpath.runtime.server import ServerConfig

FAST = ServerConfig(
    model_name="tiny", header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_timeout_s=1.0, max_connections=50
)
HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


def connect(url: str) -> socket.socket:
    u = urlparse(url)
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    return s


def closed_after(
    s: socket.socket, limit_s: float, dribble: bytes = b"", every_s: float = 0.2
) -> tuple[float, bytes]:
    """Dribble ``dribble`` one byte per ``every_s`` until the server closes; (seconds, reply)."""
    start, reply = time.monotonic(), b""
    s.settimeout(every_s)
    i = 0
    while time.monotonic() - start < limit_s:
        try:
            if i < len(dribble):
                s.sendall(dribble[i : i + 1])
                i += 1
            data = s.recv(65536)
            if not data:
                return time.monotonic() - start, reply
            reply += data
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - start, reply
    return float("inf"), reply


def test_an_idle_connection_is_closed_at_the_header_deadline(make_served) -> None:
    srv = make_served(FAST)
    took, reply = closed_after(connect(srv.url), 10.0)
    assert 0.8 <= took < 3.0 and reply == b""


def test_a_header_sent_a_byte_at_a_time_gets_408_at_the_deadline(make_served) -> None:
    srv = make_served(FAST)
    s = connect(srv.url)
    took, reply = closed_after(s, 10.0, dribble=HEAD * 20)  # never completes in time
    assert took < 3.0 and reply.startswith(b"HTTP/1.1 408"), (took, reply)


def test_a_body_sent_a_byte_at_a_time_gets_408(make_served) -> None:
    srv = make_served(FAST)
    s = connect(srv.url)
    s.sendall(HEAD + b"content-length: 100\r\n\r\n{")
    took, reply = closed_after(s, 10.0, dribble=b'"prompt"' * 20, every_s=0.3)
    assert took < 4.0 and reply.startswith(b"HTTP/1.1 408"), (took, reply)
    assert b"request body not received in time" in reply
    assert srv_metric(srv, "dualpath_http_connections_closed_total", reason="body_timeout") == 1


def test_a_kept_alive_connection_closes_after_the_keep_alive_timeout(make_served) -> None:
    srv = make_served(FAST)
    s = connect(srv.url)
    s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    s.settimeout(5)
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    took, _ = closed_after(s, 10.0)
    assert took < 3.0


def test_an_idle_flood_cannot_lock_out_a_new_client(make_served) -> None:
    """2,000 connections that send nothing against a cap of 50: the oldest idle ones are closed
    to let new ones in, and /health answers at once all the time."""
    from dualpath.runtime.server.connections import raise_fd_limit

    if raise_fd_limit()[1] < 4500:  # (client and server share this process's open-file limit)
        pytest.skip("the open-file limit cannot be raised to 4,500 here")
    srv = make_served(ServerConfig(model_name="tiny", max_connections=50))
    socks = [connect(srv.url) for _ in range(2000)]
    try:
        for _ in range(3):
            t0 = time.monotonic()
            r = httpx.get(srv.url + "/health", timeout=5)
            assert r.status_code == 200 and time.monotonic() - t0 < 2.0
        evicted = srv_metric(srv, "dualpath_http_connections_closed_total", reason="evicted_idle")
        assert evicted >= 2000 - 50
    finally:
        for s in socks:
            s.close()


def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503(make_served) -> None:
    srv = make_served(ServerConfig(model_name="tiny", max_connections=3), token_delay_s=0.5)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 20, "stream": True}
    with httpx.Client(timeout=30) as a, httpx.Client(timeout=30) as b, httpx.Client(timeout=30) as c:
        with a.stream("POST", srv.url + "/v1/completions", json=body) as ra:
            with b.stream("POST", srv.url + "/v1/completions", json=body) as rb:
                with c.stream("POST", srv.url + "/v1/completions", json=body) as rc:
                    assert ra.status_code == rb.status_code == rc.status_code == 200
                    s = connect(srv.url)
                    s.settimeout(5)
                    reply = s.recv(65536)
                    assert reply.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in reply


def srv_metric(srv, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in httpx.get(srv.url + "/metrics", timeout=10).text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0


def test_bad_limits_are_config_errors_naming_the_value() -> None:
    from dualpath.core.errors import ConfigError

    for field, value in (("header_timeout_s", 0.0), ("body_timeout_s", float("inf")), ("max_connections", 0)):
        with pytest.raises(ConfigError, match=field):
            ServerConfig(**{field: value})


def test_the_soft_fd_limit_is_raised_to_the_hard_one() -> None:
    code = (
        "import resource, json\n"
        "from dualpath.runtime.server.connections import raise_fd_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "print(json.dumps([raise_fd_limit(), hard, resource.getrlimit(resource.RLIMIT_NOFILE)[0]]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    (before, after), hard, now = json.loads(out.stdout)
    assert before == 256 and after == hard == now


def test_accept_errors_are_logged_once_per_interval(tmp_path: Path) -> None:
    """A real server whose process runs out of file descriptors while 60 clients connect: asyncio
    fails each accept many times; the log gets one line with a count, the metric every failure."""
    script = Path(__file__).with_name("accept_flood.py")
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    raw = out.stderr.count("socket.accept() out of system resource")
    ours = out.stderr.count("HTTP accept failed")
    assert result["accept_errors"] > 10 and raw == 0 and 1 <= ours <= 2, (result, raw, ours)
