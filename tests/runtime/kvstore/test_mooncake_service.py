"""The cluster's Mooncake Store: started for a cluster that names no master, used as is when the
config names one (a remote engine, or an operator's store), and the config's checks."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from dualpath.core.errors import ConfigError
from dualpath.runtime.cluster.config import ClusterConfig
from dualpath.runtime.cluster.kv_backend import capacity_bytes, open_cluster_store, start_store_service
from dualpath.runtime.kvstore.backends import missing
from dualpath.runtime.kvstore.mooncake_service import DEFAULT_SEGMENT_BYTES

from .conftest import LAYOUT, make_blocks


def test_config_names_the_backend_and_master_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="kv_backend='s3'"):
        ClusterConfig(kv_dir=str(tmp_path), kv_backend="s3")
    with pytest.raises(ConfigError, match="kv_mooncake_master='h:1'"):
        ClusterConfig(kv_dir=str(tmp_path), kv_backend="mooncake", kv_mooncake_master="h:1")
    cfg = ClusterConfig(kv_dir=str(tmp_path), kv_backend="mooncake")
    assert capacity_bytes(cfg) == DEFAULT_SEGMENT_BYTES
    assert capacity_bytes(msgspec.structs.replace(cfg, kv_capacity_gb=0.5)) == 500_000_000
    posix = ClusterConfig(kv_dir=str(tmp_path))
    assert start_store_service(posix, tmp_path) == (posix, None)  # nothing to start
    gone = msgspec.structs.replace(
        cfg, kv_mooncake_master="127.0.0.1:9", kv_mooncake_metadata="http://127.0.0.1:9/m"
    )
    with pytest.raises(ConfigError, match="kv_mooncake_master='127.0.0.1:9': no Mooncake master reachable"):
        open_cluster_store(gone, LAYOUT, "auto")  # at once, not after Mooncake's own retries


def test_a_cluster_starts_its_store_and_others_join_it(tmp_path: Path) -> None:
    if why := missing("mooncake"):
        pytest.skip(f"kv backend mooncake unavailable: {why}")
    cfg = ClusterConfig(kv_dir=str(tmp_path / "unused"), kv_backend="mooncake", kv_capacity_gb=0.1)
    named, svc = start_store_service(cfg, tmp_path)
    assert svc is not None
    procs = list(svc.procs)  # the master and the holder
    try:
        assert named.kv_mooncake_master == svc.spec.master and named.kv_mooncake_metadata == svc.spec.metadata
        assert start_store_service(named, tmp_path) == (named, None)  # a named master is used as is
        writer = open_cluster_store(named, LAYOUT, capacity_bytes(named))
        hashes, datas = make_blocks(writer, np.arange(24))
        remote = ClusterConfig(kv_dir="elsewhere", kv_backend="mooncake", kv_mooncake_master=named.kv_mooncake_master,
                               kv_mooncake_metadata=named.kv_mooncake_metadata)  # fmt: skip
        reader = open_cluster_store(remote, LAYOUT, "auto")
        assert reader.match_prefix(np.arange(24)) == hashes
        assert np.array_equal(reader.read_full(hashes[2]), datas[2])
        assert not (tmp_path / "unused").exists() and not Path("elsewhere").exists()  # no directory used
        writer.close()
        reader.close()
    finally:
        svc.stop()
    assert len(procs) == 2 and all(p.poll() is not None for p in procs)  # both ended with it
