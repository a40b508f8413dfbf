"""The systems' load-path strategies and the calibration dataclass (sim/load_path.py, calibration.py)."""

from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError
from dualpath.sim.calibration import DEFAULT_CALIBRATION, Calibration
from dualpath.sim.config import SYSTEMS, SimConfig, SystemSpec, get_system
from dualpath.sim.driver import Simulation
from dualpath.sim.load_path import FreeIO, LayerwiseLoad, WholePromptLoad, load_path_class
from dualpath.spec import get_cluster


def test_each_system_gets_its_strategy() -> None:
    expected = {"basic": WholePromptLoad, "oracle": FreeIO}
    cluster = get_cluster("ds660b-2p4d")  # EP over nodes: decode steps move all-to-all bytes
    for name in SYSTEMS:
        sim = Simulation(SimConfig(system=get_system(name), cluster=cluster), [])
        assert type(sim.load) is expected.get(name, LayerwiseLoad), name
        assert sim.load.whole_prompt_in_hbm == (name == "basic")
        assert sim.load.moves_kv == (name != "oracle")
        # Oracle puts nothing on links, EP model traffic included
        assert (sim.decode_units[0].model_bytes_per_token == 0.0) == (name == "oracle")


def test_unknown_load_path_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="free-io, layerwise, read-free, whole-prompt"):
        SystemSpec(name="x", policy="dualpath", load_path="streaming")
    with pytest.raises(ConfigError, match="streaming"):
        load_path_class("streaming")


def test_calibration_is_frozen_validated_and_replaced_not_mutated() -> None:
    with pytest.raises(ConfigError, match="STORAGE_EFFICIENCY=0.0"):
        Calibration(storage_efficiency=0.0)
    with pytest.raises(AttributeError):
        DEFAULT_CALIBRATION.storage_efficiency = 0.3  # type: ignore[misc]
    cal = DEFAULT_CALIBRATION.with_overrides(["storage_efficiency=0.3", "PREFILL_EP_NODES=4"])
    assert (cal.storage_efficiency, cal.prefill_ep_nodes) == (0.3, 4)
    assert isinstance(cal.prefill_ep_nodes, int)
    assert cal.overrides() == {"STORAGE_EFFICIENCY": 0.3, "PREFILL_EP_NODES": 4}
    assert DEFAULT_CALIBRATION.storage_efficiency == 0.5 and DEFAULT_CALIBRATION.overrides() == {}
    assert set(DEFAULT_CALIBRATION.as_constants()) >= {"FETCH_INTERVAL_S", "HBM_USABLE_FRACTION"}


def test_a_run_uses_the_calibration_it_is_given(make_cluster, make_trajectories) -> None:
    """Half the storage efficiency: Basic (PE storage bound) is slower; the default run is
    unchanged by having built the other one."""
    from dualpath.sim.harness.runner import run_one

    trajs = make_trajectories(40, turns=6, first=16384, append=200, gen=16)
    cfg = SimConfig(system=get_system("basic"), cluster=make_cluster(1, 2))
    base = run_one(cfg, trajs)
    slow = run_one(
        SimConfig(system=cfg.system, cluster=cfg.cluster, calibration=Calibration(storage_efficiency=0.25)),
        trajs,
    )
    again = run_one(cfg, trajs)
    assert slow["jct_s"] > base["jct_s"]
    assert again["jct_s"] == base["jct_s"]
