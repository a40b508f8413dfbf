"""OpenAI-style API errors: one exception type, one JSON body shape, one mapping from cluster errors.

Body (what the ``openai`` client parses): ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

from typing import Any

from dualpath.core.errors import DualpathError
from dualpath.runtime.cluster.api import (
    ClusterError,
    ClusterUnavailableError,
    ContextTooLongError,
    QueueFullError,
)


class APIError(DualpathError):
    """An HTTP error answer. ``param`` names the offending request field (None if none)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or _default_kind(status)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _default_kind(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def bad_param(param: str, value: object, reason: str) -> APIError:
    """400 naming the field and quoting the value, e.g. ``temperature=-1: must be >= 0``."""
    return APIError(400, f"{param}={value!r}: {reason}", param=param, code="invalid_value")


def from_cluster_error(exc: ClusterError) -> APIError:
    """Map a refusal of the cluster to its HTTP answer (429 / 400 / 503 / 400)."""
    if isinstance(exc, QueueFullError):
        return APIError(429, f"the scheduler queue is full, retry later ({exc})", code="queue_full")
    if isinstance(exc, ContextTooLongError):
        return APIError(400, f"context too long: {exc}", param="max_tokens", code="context_length_exceeded")
    if isinstance(exc, ClusterUnavailableError):
        return APIError(503, f"cluster unavailable: {exc}", code="cluster_unavailable")
    return APIError(400, f"cluster refused the request: {exc}", code="cluster_error")
