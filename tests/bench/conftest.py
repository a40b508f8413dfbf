from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dualpath.runtime.server import BackgroundServer, CharTokenizer, create_app

_FAKE = Path(__file__).resolve().parents[1] / "runtime" / "server" / "fake_cluster.py"


def _load_fake():  # --import-mode=importlib: load the server tests' fake cluster by path
    name = "dualpath_test_fake_cluster"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _FAKE)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


@pytest.fixture
def fake_server() -> Iterator:
    """(url, fake cluster) of our API over the in-process fake (context 2048, vocab 256)."""
    fake = _load_fake().FakeCluster(max_context_len=2048)
    with BackgroundServer(create_app(lambda: fake, CharTokenizer())) as srv:
        yield srv.url, fake


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of our API over a real local 1P1D cluster of the tiny random model (as tests/runtime)."""
    from dualpath.runtime.cluster.config import ClusterConfig
    from dualpath.runtime.cluster.local import LocalCluster
    from dualpath.runtime.server import ServerConfig

    cfg = ClusterConfig(
        kv_dir=str(tmp_path_factory.mktemp("kv")), model="tiny", num_prefill_engines=1, num_decode_engines=1
    )
    with LocalCluster(cfg) as cluster:
        app = create_app(cluster.address, CharTokenizer(vocab_size=512), ServerConfig(model_name="tiny"))
        with BackgroundServer(app) as srv:
            yield srv.url
