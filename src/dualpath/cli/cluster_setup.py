"""Option and setup steps that ``dualpath serve``, ``engine`` and ``scheduler`` share: one typer
option per ``ClusterConfig`` field with its documented default, and the KV-store checks each
command runs before starting anything (one error line naming the bad value)."""

from __future__ import annotations

from typing import Any

import typer

from dualpath.cli._common import default_of
from dualpath.core.errors import ConfigError
from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig, TrafficConfig


def cluster_option(name: str, text: str) -> Any:
    """A typer option whose default is ``ClusterConfig``'s field ``name``."""
    return typer.Option(default_of(ClusterConfig, name), help=text)


def require_mooncake_master(kv_backend: str, mooncake_master: str) -> None:
    """--kv-backend mooncake without --mooncake-master: a ConfigError naming it."""
    if kv_backend == "mooncake" and not mooncake_master:
        raise ConfigError(
            "mooncake_master", "", "--kv-backend mooncake needs --mooncake-master and --mooncake-metadata"
        )


def check_kv_store(kv_backend: str, kv_dir: str) -> None:
    """The backend's package present and (file backends) the KV directory usable, now."""
    from dualpath.runtime.cluster.local import check_kv_dir
    from dualpath.runtime.kvstore.backends import check_available

    check_available(kv_backend)  # a backend whose package is not here: one error line, now
    if kv_backend != "mooncake":
        check_kv_dir(kv_dir)  # (a read-only or unusable directory: one error line, now)


def engine_config(compute_quota_ms: float, quota_scope: str, kv_cache_memory: str) -> EngineConfig:
    """The engines' EngineConfig from the CLI's quota (ms), scope and KV memory."""
    return EngineConfig(
        compute_quota_s=compute_quota_ms / 1e3, quota_scope=quota_scope, kv_cache_memory=kv_cache_memory
    )


def traffic_config(snic_gbps: float | None, cnic_gbps: float | None = None) -> TrafficConfig:
    """The emulated NIC caps."""
    return TrafficConfig(snic_gbps=snic_gbps, cnic_gbps=cnic_gbps)
