"""The transport contract runs on every cross-process transport: ``kind`` is each of
``TRANSPORT_NAMES``, skipped (with the reason naming the missing piece) where its engine package does
not import here; ``make(**kw)`` builds one of that kind, closed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dualpath.runtime.choices import TRANSPORT_NAMES


@pytest.fixture(params=TRANSPORT_NAMES)
def kind(request: pytest.FixtureRequest) -> str:
    from dualpath.runtime.transfer.factory import missing

    why = missing(request.param)
    if why is not None:
        pytest.skip(f"transport {request.param} not importable here: {why}")
    return request.param


def build(kind: str, ring_bytes: int | None = None, **kw: Any) -> Any:
    """A transport of ``kind``; ``ring_bytes`` (shm and the engines): its ring size."""
    from dualpath.runtime.transfer.factory import make_transport

    if ring_bytes is None:
        return make_transport(kind, **kw)
    if kind == "shm":
        from dualpath.runtime.transfer.shm_transport import ShmTransport

        return ShmTransport(ring_bytes=ring_bytes, **kw)
    if kind == "mooncake":
        from dualpath.runtime.transfer.mooncake import mooncake_transport

        return mooncake_transport(ring_bytes=ring_bytes, **kw)
    if kind == "nixl":
        from dualpath.runtime.transfer.nixl import nixl_transport

        return nixl_transport(ring_bytes=ring_bytes, **kw)
    return make_transport(kind, **kw)


@pytest.fixture
def make(kind: str) -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def _make(**kw: Any) -> Any:
        made.append(build(kind, **kw))
        return made[-1]

    yield _make
    for t in made:
        t.close()
