"""Run the HTTP server: in the foreground (``dualpath serve``) or in a background thread (tests, demo)."""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from dualpath.core.errors import ConfigError
from dualpath.runtime.server.app import create_app
from dualpath.runtime.server.config import ServerConfig
from dualpath.runtime.server.connections import connection_cap, raise_fd_limit, uvicorn_config
from dualpath.runtime.server.tokenizer import Tokenizer, load_tokenizer
from dualpath.spec.clusters import DEFAULT_RUNTIME_MODEL


def run_server(
    cluster_address: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    model: str = DEFAULT_RUNTIME_MODEL,
    tokenizer: Tokenizer | None = None,
    api_key: str | None = None,
    served_model_name: str | None = None,
    log_level: str = "warning",
    cluster_key_file: str | None = None,
    **limits: Any,
) -> None:
    """Serve the OpenAI API for the cluster whose scheduler is at ``cluster_address``; blocks.

    ``model`` picks the tokenizer ("tiny" -> the character tokenizer of the tiny test model, whose
    vocabulary has 512 ids as built by ``runtime.cluster.local.tiny_model_dir``) and is the model
    id clients send unless ``served_model_name`` says otherwise. ``limits``: other ServerConfig
    fields (``header_timeout_s``, ``max_connections``, ...)."""
    config = ServerConfig(
        host=host,
        port=port,
        api_key=api_key,
        model_name=served_model_name or model,
        cluster_key_file=cluster_key_file,
        **limits,
    )
    tok = tokenizer or load_tokenizer(model, vocab_size=512)
    app = create_app(cluster_address, tok, config)
    setup_logging()
    report_fd_limit(config)
    uv = uvicorn_config(
        app, config, host=config.host, port=config.port, log_level=log_level, access_log=False
    )
    uvicorn.Server(uv).run()


def report_fd_limit(config: ServerConfig) -> None:
    """Raise the soft open-file limit to the hard one and say what the server runs with."""
    before, after = raise_fd_limit()
    raised = f"raised from {before} to {after}" if after > before else f"{after} (not raised)"
    logging.getLogger("dualpath.server").info(
        "open-file limit %s; at most %d HTTP connections (max_connections %d, held under half the limit)",
        raised,
        connection_cap(config),
        config.max_connections,
    )


def preflight(host: str, port: int, model: str, api_key: str | None = None, **limits: Any) -> Tokenizer:
    """What ``dualpath serve`` checks before any engine starts: the server settings, the HTTP
    port free, the tokenizer of ``model`` loadable. Returns the tokenizer; raises ConfigError."""
    ServerConfig(host=host, port=port, api_key=api_key, model_name=model, **limits)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError("port", port, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return load_tokenizer(model, vocab_size=512)


def setup_logging(level: int = logging.INFO) -> None:
    """Access lines (``dualpath.access``) and error lines (``dualpath.server``) to stderr, in
    uvicorn's ``LEVEL:     message`` shape (our access log replaces uvicorn's)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    for name in ("dualpath.access", "dualpath.server"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False


class BackgroundServer:
    """Serves an app on a free loopback port from a daemon thread; ``url`` is set once listening.

    ``with BackgroundServer(app) as srv: httpx.get(srv.url + "/health")``.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", startup_timeout_s: float = 30.0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{port}"
        state = getattr(getattr(app, "state", None), "dualpath", None)
        config = getattr(state, "config", None) or ServerConfig()
        self._server = uvicorn.Server(uvicorn_config(app, config, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._run, daemon=True, name="dualpath-http")
        self._startup_timeout_s = startup_timeout_s
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # surfaced by start()
            self._error = exc

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if self._error is not None or not self._thread.is_alive():
                raise ConfigError("server", self.url, f"failed to start: {self._error}")
            if time.monotonic() > deadline:
                raise ConfigError("server", self.url, "did not start in time")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_background(
    cluster: str | Callable[[], Any], tokenizer: Tokenizer, config: ServerConfig | None = None
) -> BackgroundServer:
    """Start the API for ``cluster`` in a thread (not yet started: use as a context manager)."""
    return BackgroundServer(create_app(cluster, tokenizer, config))
