"""Run by test_connections.py: a real server (fake cluster) whose process has no free file
descriptor while a client process opens 60 connections; prints the accept-error metric as JSON.
The log goes to stderr (the test counts its lines)."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

from dualpath.runtime.server import BackgroundServer, CharTokenizer, ServerConfig, create_app

CLIENT = """
import socket, sys, time
time.sleep(1.0)
socks = [socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) for _ in range(60)]
time.sleep(3.0)
"""


def main() -> None:
    spec = importlib.util.spec_from_file_location("fake", Path(__file__).with_name("fake_cluster.py"))
    fake_mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(fake_mod)  # type: ignore[union-attr]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    fake = fake_mod.FakeCluster()
    with BackgroundServer(create_app(lambda: fake, CharTokenizer(), ServerConfig(model_name="tiny"))) as srv:
        u = urlparse(srv.url)
        client = subprocess.Popen([sys.executable, "-c", CLIENT, str(u.hostname), str(u.port)])
        held = []
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        time.sleep(4.5)  # the client connects meanwhile; every accept fails
        for fd in held:
            os.close(fd)
        client.wait(30)
        text = httpx.get(srv.url + "/metrics", timeout=10).text
    value = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("dualpath_http_accept_errors_total")
    )
    print(json.dumps({"accept_errors": value}))


if __name__ == "__main__":
    main()
