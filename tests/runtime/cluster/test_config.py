"""The runtime's config spine: ClusterConfig composes the scheduler, engine and traffic sections,
each default is defined once, the process arguments carry the config whole, and alpha's read rate
comes from a cap, a configured rate or a measurement (never a silent constant)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from dualpath.core.errors import ConfigError, UnknownNameError
from dualpath.policy import SchedulerConfig
from dualpath.policy.config import COMPUTE_QUOTA_S
from dualpath.runtime.cluster.config import (
    ClusterConfig,
    EngineArgs,
    EngineConfig,
    SchedulerArgs,
    SchedulerServiceConfig,
    TrafficConfig,
)
from dualpath.runtime.cluster.scheduler import SchedulerService


def test_one_compute_quota_default() -> None:
    from dualpath.runtime.engine.local import LocalConfig

    assert EngineConfig().compute_quota_s == SchedulerConfig().compute_quota_s == COMPUTE_QUOTA_S
    assert LocalConfig(kv_dir="x").compute_quota_s == COMPUTE_QUOTA_S


def test_process_args_carry_the_config_whole(tmp_path: Path) -> None:
    cfg = ClusterConfig(
        kv_dir=str(tmp_path),
        model="tiny",
        policy="basic",
        engine=EngineConfig(compute_quota_s=0.1, heartbeat_s=0.1),
        traffic=TrafficConfig(snic_gbps=2.0, snic_directions="shared"),
        scheduler=SchedulerServiceConfig(engine_timeout_s=3.0),
    )
    eng = EngineArgs(cluster=cfg, scheduler="tcp://127.0.0.1:1", role="decode", node_id=1)
    back = msgspec.json.decode(msgspec.json.encode(eng), type=EngineArgs)  # as LocalCluster spawns
    assert back == eng and back.cluster.engine.compute_quota_s == 0.1
    sched = SchedulerArgs(cluster=cfg, kv_capacity_bytes=10**9)
    assert msgspec.json.decode(msgspec.json.encode(sched), type=SchedulerArgs) == sched
    assert sched.bind == "tcp://127.0.0.1:0"


def test_validation_names_the_value(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="dualpath-split"):
        ClusterConfig(kv_dir=str(tmp_path), policy="nosuch")
    with pytest.raises(UnknownNameError, match="zmq"):
        ClusterConfig(kv_dir=str(tmp_path), transport="nosuch")
    with pytest.raises(ConfigError, match="scheduler.engine_timeout_s"):
        ClusterConfig(
            kv_dir=str(tmp_path),
            engine=EngineConfig(heartbeat_s=1.0),
            scheduler=SchedulerServiceConfig(engine_timeout_s=1.5),
        )
    with pytest.raises(ConfigError, match="snic_directions"):
        TrafficConfig(snic_directions="half")
    with pytest.raises(ConfigError, match="snic_gbps"):
        TrafficConfig(snic_gbps=0.0)
    with pytest.raises(ConfigError, match="dtype"):
        EngineConfig(dtype="int4")


def test_beta_rate_configured_or_per_model() -> None:
    for bad in ({"pe_scope": "cluster"}, {"read_tie": "both"}, {"pe_tie": "random"}):
        ((key, value),) = bad.items()
        with pytest.raises(ConfigError, match=f"{key}.*{value}"):
            SchedulerServiceConfig(**bad)
    assert SchedulerServiceConfig().beta_rate("tiny") == 200_000.0
    assert SchedulerServiceConfig().beta_rate("smollm2-135m") == 20_000.0
    assert SchedulerServiceConfig(prefill_tokens_per_s=7.0).beta_rate("tiny") == 7.0


@pytest.mark.parametrize(
    "traffic,sched,source,rate",
    [
        (TrafficConfig(snic_gbps=8.0), SchedulerServiceConfig(), "snic cap", 1e9),
        (TrafficConfig(), SchedulerServiceConfig(storage_read_gbps=16.0), "configured", 2e9),
        (TrafficConfig(), SchedulerServiceConfig(), "measured", None),
    ],
)
def test_alpha_read_rate_is_never_a_silent_constant(
    tmp_path: Path, traffic: TrafficConfig, sched: SchedulerServiceConfig, source: str, rate: float | None
) -> None:
    cfg = ClusterConfig(kv_dir=str(tmp_path), traffic=traffic, scheduler=sched)
    svc = SchedulerService(SchedulerArgs(cluster=cfg))
    try:
        got = svc._read_bytes_per_s()
        assert svc.read_rate_source == source
        if rate is not None:
            assert got == rate
        else:
            assert got > 0 and got != 50e9
            assert svc._read_bytes_per_s() == got  # measured once
            assert not list(tmp_path.glob(".read-rate-*"))  # the scratch file is gone
    finally:
        svc.close()
