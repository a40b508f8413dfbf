from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dualpath.runtime.server import BackgroundServer, CharTokenizer, ServerConfig, create_app


def _load_fake():  # tests run with --import-mode=importlib: load the helper by path
    name = "dualpath_test_fake_cluster"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("fake_cluster.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


fake_cluster = _load_fake()


class Served:
    def __init__(self, url: str, fake) -> None:
        self.url = url
        self.fake = fake
        self.tok = CharTokenizer()


@pytest.fixture
def make_served() -> Iterator:
    servers: list[BackgroundServer] = []

    def make(config: ServerConfig | None = None, **fake_kw) -> Served:
        fake = fake_cluster.FakeCluster(**fake_kw)
        srv = BackgroundServer(create_app(lambda: fake, CharTokenizer(), config)).start()
        servers.append(srv)
        return Served(srv.url, fake)

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def served(make_served) -> Served:
    return make_served()
