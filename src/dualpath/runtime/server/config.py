"""ServerConfig: how the HTTP layer listens and what it accepts (frozen, validated, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import require


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """``host`` defaults to loopback; serving other hosts must be asked for explicitly.

    ``api_key``: when set, every ``/v1/*`` request needs ``Authorization: Bearer <api_key>``.
    ``model_name``: the id clients send as ``model`` (None: the cluster's model name).
    ``default_max_tokens``: used when a request names no ``max_tokens`` (capped by the context).
    ``token_timeout_s``: longest wait for the next token before the request fails (none hangs).
    ``max_request_bytes``: larger bodies get 413. ``cluster_query_timeout_s``: how long
    info/health/metrics queries wait for the scheduler before the answer is 503.
    ``cluster_key_file``: read when the client is made (not here: a config does no I/O).

    Connection limits (``connections.py``; defaults from Apache's mod_reqtimeout, ``header=20``,
    ``body=20,MinRate=500``, and uvicorn's keep-alive and h11's head size): ``header_timeout_s``,
    the time from a connection's opening (or its previous response) to a complete request head;
    ``body_timeout_s`` plus one second per ``body_min_rate_bytes_per_s`` received, the time for the
    body; ``keep_alive_timeout_s``, the idle time after a response before the connection closes;
    ``max_header_bytes``, the largest request head; ``max_connections``, open connections (held
    under half the open-file limit).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model_name: str | None = None
    default_max_tokens: int = 256
    token_timeout_s: float = 120.0
    max_request_bytes: int = 8 * 1024 * 1024
    cluster_query_timeout_s: float = 5.0
    cluster_key_file: str | None = None  # the cluster's CURVE key file (an authenticated cluster)
    header_timeout_s: float = 20.0
    body_timeout_s: float = 20.0
    body_min_rate_bytes_per_s: float = 500.0
    keep_alive_timeout_s: float = 5.0
    max_header_bytes: int = 16 * 1024
    max_connections: int = 4096

    def __post_init__(self) -> None:
        require(self.host != "", "host", self.host, "must name an interface (127.0.0.1 = loopback)")
        require(0 <= self.port < 65536, "port", self.port, "must be a TCP port (0 = any free port)")
        require(
            self.api_key is None or self.api_key != "",
            "api_key",
            self.api_key,
            "must be None or a non-empty string",
        )
        require(self.default_max_tokens >= 1, "default_max_tokens", self.default_max_tokens, "must be >= 1")
        require(self.token_timeout_s > 0, "token_timeout_s", self.token_timeout_s, "must be > 0")
        require(
            self.cluster_query_timeout_s > 0,
            "cluster_query_timeout_s",
            self.cluster_query_timeout_s,
            "must be > 0",
        )
        require(
            self.max_request_bytes >= 1024, "max_request_bytes", self.max_request_bytes, "must be >= 1024"
        )
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            require(value > 0 and value != float("inf"), name, value, "must be a finite number > 0")
        rate = self.body_min_rate_bytes_per_s
        require(rate > 0, "body_min_rate_bytes_per_s", rate, "must be > 0")
        require(self.max_header_bytes >= 1024, "max_header_bytes", self.max_header_bytes, "must be >= 1024")
        require(self.max_connections >= 1, "max_connections", self.max_connections, "must be >= 1")
