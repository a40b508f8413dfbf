"""The cluster's KV store on its backend (``--kv-backend``): opening it in each process, and the
Mooncake Store a local cluster starts for itself.

Every process (scheduler, engines) opens its ``BlockStore`` with ``open_cluster_store``, from the
cluster config alone, so a remote ``dualpath engine`` given the same ``--kv-backend`` flags reaches
the same blocks. With ``--kv-backend mooncake`` and no ``--mooncake-master``, the process that
starts a local cluster starts ``mooncake_master`` and a holder of ``--kv-capacity-gb`` of memory
(``kvstore.mooncake_service``; default ``DEFAULT_SEGMENT_BYTES``) and stops them with the cluster.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from dualpath.runtime.cluster.config import ClusterConfig
from dualpath.runtime.kvstore import BlockLayout, BlockStore
from dualpath.runtime.kvstore.backends import open_backend
from dualpath.runtime.kvstore.limits import capacity_from_gb
from dualpath.runtime.kvstore.mooncake_backend import MooncakeSpec
from dualpath.runtime.kvstore.mooncake_service import DEFAULT_SEGMENT_BYTES, MooncakeService


def mooncake_spec(cluster: ClusterConfig) -> MooncakeSpec | None:
    """Where the cluster's Mooncake Store is (None: not mooncake, or no master given yet)."""
    if cluster.kv_backend != "mooncake" or not cluster.kv_mooncake_master:
        return None
    return MooncakeSpec(
        master=cluster.kv_mooncake_master, metadata=cluster.kv_mooncake_metadata, host=cluster.host
    )


def open_cluster_store(cluster: ClusterConfig, layout: BlockLayout, capacity: int | None | str) -> BlockStore:
    """This process's store of the cluster's blocks (ConfigError naming a missing package)."""
    backend = open_backend(
        cluster.kv_backend,
        cluster.kv_dir,
        layout,
        file_mode=cluster.kv_file_mode,
        mooncake=mooncake_spec(cluster),
    )
    return BlockStore(cluster.kv_dir, layout, capacity, file_mode=cluster.kv_file_mode, backend=backend)  # type: ignore[arg-type]


def uses_directory(cluster: ClusterConfig) -> bool:
    """Whether the blocks live under ``kv_dir`` (posix, nixl-posix)."""
    return cluster.kv_backend != "mooncake"


def capacity_bytes(cluster: ClusterConfig) -> int:
    """The store's capacity for every process: the file system's share under ``kv_dir``, or the
    Mooncake holder's memory (``--kv-capacity-gb``, default ``DEFAULT_SEGMENT_BYTES``)."""
    if uses_directory(cluster):
        return capacity_from_gb(cluster.kv_capacity_gb, cluster.kv_dir)
    return int(cluster.kv_capacity_gb * 1e9) if cluster.kv_capacity_gb else DEFAULT_SEGMENT_BYTES


def start_store_service(
    cluster: ClusterConfig, run_dir: Path
) -> tuple[ClusterConfig, MooncakeService | None]:
    """A Mooncake Store for a mooncake cluster that names no master (the config then names it)."""
    if cluster.kv_backend != "mooncake" or cluster.kv_mooncake_master:
        return cluster, None
    svc = MooncakeService.start(
        run_dir / "mooncake", host=cluster.host, segment_bytes=capacity_bytes(cluster)
    )
    named = msgspec.structs.replace(
        cluster, kv_mooncake_master=svc.spec.master, kv_mooncake_metadata=svc.spec.metadata
    )
    return named, svc
