"""The ``dualpath demo`` cluster: a local cluster behind the OpenAI-compatible HTTP API, in-process.

``ServedCluster`` is what ``dualpath serve`` runs (the scheduler and engine processes, the same
HTTP app and tokenizer), with the API on a free loopback port; the demo and the throughput
benchmark measure it with ``dualpath.bench`` over HTTP, as a user measures ``dualpath serve`` with
``dualpath bench``. Between systems the cluster is reconfigured while idle (policy; Oracle's free
reads; the storage-NIC cap) over the scheduler's control channel, as restarting ``dualpath serve
--policy X`` would, without reloading the model. Storage NICs are capped so KV loading binds.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from dualpath.core.registry import lookup
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.cluster.config import (
    DEMO_SYSTEMS,
    ClusterConfig,
    DemoConfig,
    EngineConfig,
    SchedulerServiceConfig,
    TrafficConfig,
)
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.server.config import ServerConfig


def demo_cluster_config(cfg: DemoConfig, kv_dir: str) -> ClusterConfig:
    """The demo's cluster: cfg's engines and model, storage NICs capped at ``cfg.snic``."""
    return ClusterConfig(
        kv_dir=kv_dir,
        model=cfg.model,
        num_prefill_engines=cfg.num_prefill_engines,
        num_decode_engines=cfg.num_decode_engines,
        transport=cfg.transport,
        kv_backend=cfg.kv_backend,
        traffic=TrafficConfig(snic_gbps=cfg.snic, cnic_gbps=cfg.cnic_gbps),
        scheduler=SchedulerServiceConfig(engine_timeout_s=30.0),
        # the paper's batching rule (a quota of attention time) for the paper's systems: the demo
        # compares them, and its recorded numbers (docs/cluster.md) were measured with it
        engine=EngineConfig(quota_scope="attention"),
    )


class ServedCluster:
    """``with ServedCluster(config) as sc: ... sc.url ...``: start a LocalCluster of ``config``
    and serve its API at ``url`` (loopback, a free port) with ``server``'s settings (its host and
    port aside; None: ``dualpath serve``'s defaults); stop both on exit."""

    def __init__(self, config: ClusterConfig, server: ServerConfig | None = None) -> None:
        self.config = config
        self.server_config = server or ServerConfig()
        self.cluster = LocalCluster(config)
        self.url = ""
        self._server: Any = None

    def __enter__(self) -> ServedCluster:
        from dualpath.runtime.server import BackgroundServer, create_app, load_tokenizer

        try:
            self.cluster.start()
            tok = load_tokenizer(self.config.model, vocab_size=512)
            server = replace(
                self.server_config, model_name=self.server_config.model_name or self.config.model
            )
            app = create_app(self.cluster.address, tok, server)
            self._server = BackgroundServer(app).start()
        except BaseException:
            self.__exit__()
            raise
        self.url = self._server.url
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.cluster.stop()

    def configure(self, system: str, snic_gbps: float | None = None) -> None:
        """Switch to ``system`` (a ``DEMO_SYSTEMS`` name: policy and free reads) and, when given,
        every node's storage-NIC cap; only while idle (the scheduler refuses otherwise)."""
        asyncio.run(self.configure_async(system, snic_gbps))

    async def configure_async(self, system: str, snic_gbps: float | None = None) -> None:
        """``configure`` from inside a running event loop."""
        policy, free = lookup(DEMO_SYSTEMS, system, "system")
        async with ClusterClient(self.cluster.address, query_timeout_s=60.0) as client:
            await client.configure(policy, read_free=free, snic_gbps=snic_gbps)


@contextmanager
def served_demo_cluster(cfg: DemoConfig, server: ServerConfig | None = None) -> Iterator[ServedCluster]:
    """The demo's ``ServedCluster``; its KV directory is ``cfg.kv_dir`` or a temporary one
    (removed afterwards)."""
    kv_dir = cfg.kv_dir or tempfile.mkdtemp(prefix="dualpath-demo-kv-")
    try:
        with ServedCluster(demo_cluster_config(cfg, kv_dir), server) as served:
            yield served
    finally:
        if not cfg.kv_dir:
            shutil.rmtree(kv_dir, ignore_errors=True)
