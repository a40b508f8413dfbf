from __future__ import annotations

import dataclasses

import pytest

from dualpath.policy.ledger import Ledger, ViewBounds
from dualpath.sim.compiled import is_compiled
from dualpath.sim.config import SYSTEMS, SimConfig, get_system
from dualpath.sim.driver import Simulation
from dualpath.sim.harness.runner import make_agents, run_one, run_systems

# These tests watch a run by patching methods of simulator classes, which a mypyc build compiles
# into native classes (tests/sim/test_compiled_build.py runs this folder against that build).
patches_methods = pytest.mark.skipif(is_compiled(), reason="patches methods of compiled classes")


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_every_system_finishes_with_invariants(system: str, make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(24)
    result = run_one(SimConfig(system=get_system(system), cluster=make_cluster()), trajs)
    assert result["agents_finished"] == 24
    assert result["num_requests"] == sum(t.num_turns for t in trajs)
    assert result["jct_s"] > 0
    assert result["max_link_utilisation"] <= 1.0 + 1e-9
    if system == "oracle":
        bd = result["ttft_breakdown_s"]
        assert bd["allocation"] == 0.0 and bd["reading"] == 0.0


def test_oracle_le_dualpath_le_basic_when_io_bound(make_cluster, make_trajectories) -> None:
    # Many agents with long contexts and short appends: storage bound on the PE side.
    trajs = make_trajectories(160, turns=8, first=16384, append=200, gen=16)
    cluster = make_cluster(1, 2)
    res = run_systems(["oracle", "dualpath", "basic"], cluster, trajs)
    assert res["oracle"]["jct_s"] <= res["dualpath"]["jct_s"] * 1.001
    assert res["dualpath"]["jct_s"] < res["basic"]["jct_s"]


def test_deterministic_by_seed(make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(16)
    cfg = SimConfig(system=get_system("dualpath"), cluster=make_cluster(), seed=3)
    a, b = run_one(cfg, trajs), run_one(cfg, trajs)
    for key in ("jct_s", "events", "num_requests", "mean_ttft_s", "bytes"):
        assert a[key] == b[key]


def _run(
    cfg: SimConfig,
    trajs,
    order: dict | None = None,
    bounds: ViewBounds | None = None,
    views: bool = False,
) -> dict:
    """One run with fields of the adapter's fetch order (``order``: name -> value) / its view
    bounds replaced (speed knobs under test); ``views``: every fetch builds its view (no fetch
    kernels, policy/fetch_kernels.py)."""
    sim = Simulation(cfg, make_agents(trajs))
    if views:
        sim.adapter.fetcher.slack, sim.adapter.fetcher.prefill_kernel = -1.0, False
    if order is not None:
        sim.adapter.fetcher.order = dataclasses.replace(sim.adapter.fetcher.order, **order)
    if bounds is not None:
        sim.adapter.ledger.bounds = bounds
    return sim.run()


def test_fetch_elision_does_not_change_results(make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(120, turns=6, first=8192, append=250, gen=24)
    cfg = SimConfig(system=get_system("dualpath"), cluster=make_cluster(1, 1))
    with_elision = _run(cfg, trajs)
    without = _run(cfg, trajs, order={"elide": False})
    assert with_elision["jct_s"] == without["jct_s"]
    assert with_elision["bytes"] == without["bytes"]
    # bounded queue prefixes in PE views (refetched when fully taken) give the same plans too
    tiny = _run(cfg, trajs, order={"elide": False}, bounds=ViewBounds(prefill_prefix=2))
    assert tiny["jct_s"] == without["jct_s"] and tiny["bytes"] == without["bytes"]
    whole = _run(cfg, trajs, bounds=ViewBounds(prefill_prefix=None))
    assert whole["jct_s"] == without["jct_s"] and whole["bytes"] == without["bytes"]


@patches_methods
@pytest.mark.parametrize("system", ["dualpath", "basic"])
def test_bounded_private_queue_views_do_not_change_results(
    make_cluster, make_trajectories, monkeypatch, system
) -> None:
    """DE views carry the private queue only up to the first request past the group's free HBM
    (policy/ledger.py ViewBounds.bound_private). 600 agents with ~60K contexts overfill the DE HBM
    of DS 660B 2P4D, so most DE fetches see a queue that is cut (checked below)."""
    trajs = make_trajectories(600, turns=3, first=60000, append=400, gen=2000)
    cfg = SimConfig(system=get_system(system), cluster=make_cluster(2, 4, model="deepseek-v3.2"))
    cuts = []
    prefix = Ledger._private_prefix

    def counted(self, queue, group):
        out = prefix(self, queue, group)
        cuts.append(len(out) < len(queue))
        return out

    monkeypatch.setattr(Ledger, "_private_prefix", counted)
    bounded = _run(cfg, trajs, bounds=ViewBounds(private_full=0), views=True)
    assert sum(cuts) > len(cuts) // 2
    full = _run(cfg, trajs, bounds=ViewBounds(bound_private=False), views=True)
    kernels = _run(cfg, trajs)  # (dualpath's DE fetches: the kernel, which cuts on its own)
    for key in ("jct_s", "bytes", "mean_ttft_s", "mean_tpot_s", "events"):
        assert bounded[key] == full[key] == kernels[key], key


@pytest.mark.parametrize("system", ["dualpath", "basic"])
def test_central_pe_scope_kernels_views_and_elision_agree(make_cluster, make_trajectories, system) -> None:
    """``pe_scope="central"`` (docs/policy.md, "PE scope") on 2 PE nodes: the central fetch kernel
    and the view path give the same run, with and without fetch elision (the once-per-round
    elision test over every PE), and the scope does change the run (first turns reach both PE
    nodes at once)."""
    trajs = make_trajectories(96, turns=4, first=8192, append=250, gen=24)
    cluster = make_cluster(2, 2)
    cfg = SimConfig(system=get_system(system), cluster=cluster, pe_scope="central")
    kernel = _run(cfg, trajs)
    views = _run(cfg, trajs, views=True)
    no_elision = _run(cfg, trajs, order={"elide": False})
    for key in ("jct_s", "bytes", "mean_ttft_s", "events"):
        assert kernel[key] == views[key] == no_elision[key], key
    group = _run(SimConfig(system=get_system(system), cluster=cluster, pe_scope="group"), trajs)
    assert group["events"] != kernel["events"] or group["jct_s"] != kernel["jct_s"]
