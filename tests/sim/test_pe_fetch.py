"""PE groups fetching between their iterations (``SimConfig.pe_fetch="boundary"``)."""

from __future__ import annotations

import pytest

from dualpath.core.errors import DualpathError
from dualpath.sim.compiled import is_compiled
from dualpath.sim.config import PE_FETCHES, SimConfig, get_system
from dualpath.sim.driver import Simulation
from dualpath.sim.harness.runner import make_agents

# The first test watches a run by patching methods, which a mypyc build compiles into native
# classes (tests/sim/test_compiled_build.py runs this folder against that build).
patches_methods = pytest.mark.skipif(is_compiled(), reason="patches methods of compiled classes")


def _sim(make_cluster, trajs, system: str, pe_fetch: str, **kw) -> Simulation:
    cfg = SimConfig(system=get_system(system), cluster=make_cluster(**kw), pe_fetch=pe_fetch)
    return Simulation(cfg, make_agents(trajs))


def test_the_choices_and_a_bad_value(make_cluster) -> None:
    assert PE_FETCHES == ("tick", "boundary")
    with pytest.raises(DualpathError, match="pe_fetch"):
        SimConfig(system=get_system("dualpath"), cluster=make_cluster(), pe_fetch="iteration")


@patches_methods
@pytest.mark.parametrize("system", ["dualpath", "basic"])
def test_no_group_fetches_mid_iteration(system: str, make_cluster, make_trajectories) -> None:
    """Under "boundary" every PE fetch that assigns work runs at its unit's iteration end or
    while the unit is idle; under "tick" some run mid-iteration (so the check can fail)."""
    trajs = make_trajectories(48, turns=5, first=8192)
    counts = {}
    for pe_fetch in PE_FETCHES:
        sim = _sim(make_cluster, trajs, system, pe_fetch)
        fetcher = sim.adapter.fetcher
        at_boundary = [False]
        mid = [0, 0]  # fetches that assigned work mid-iteration, all that assigned work
        boundary, fetch = fetcher.fetch_at_boundary, fetcher.fetch_prefill

        def on_boundary(nodes, now_s, boundary=boundary, at_boundary=at_boundary) -> None:
            at_boundary[0] = True
            boundary(nodes, now_s)
            at_boundary[0] = False

        def on_fetch(node, now_s, sim=sim, fetch=fetch, at_boundary=at_boundary, mid=mid) -> int:
            busy = sim.pe_group_busy(node) and not at_boundary[0]  # (before its reads kick it)
            n = fetch(node, now_s)
            mid[0] += busy and n > 0
            mid[1] += n > 0
            return n

        fetcher.fetch_at_boundary, fetcher.fetch_prefill = on_boundary, on_fetch
        res = sim.run()
        assert res["agents_finished"] == len(trajs)
        counts[pe_fetch] = tuple(mid)
    assert counts["boundary"][0] == 0 and counts["boundary"][1] > 0, counts
    assert counts["tick"][0] > 0, counts


def test_boundary_waits_show_as_scheduling(make_cluster, make_trajectories) -> None:
    """Requests that arrive while their group iterates wait for its boundary: the scheduling
    share of TTFT grows, and every run still finishes with its invariants checked."""
    trajs = make_trajectories(48, turns=5, first=8192)
    res = {f: _sim(make_cluster, trajs, "dualpath", f).run() for f in PE_FETCHES}
    for r in res.values():
        assert r["agents_finished"] == len(trajs)
    sched = {f: r["ttft_breakdown_s"]["scheduling"] for f, r in res.items()}
    assert sched["boundary"] > sched["tick"], sched


def test_boundary_rotates_which_group_fetches_first(make_cluster, make_trajectories) -> None:
    """A unit spanning two nodes fetches for both at each boundary, the first one alternating:
    Basic (reads on the PE node only) spreads its reads over both PE nodes' SNICs."""
    trajs = make_trajectories(64, turns=5, first=8192)
    sim = _sim(make_cluster, trajs, "basic", "boundary", p=2, d=4, model="deepseek-v3.2")
    assert any(len({st.node_id for st in u.states}) == 2 for u in sim.prefill_units)
    sim.run()
    reads = [n.snic_read_bytes for n in sim.cluster.nodes if n.role == "pe"]
    assert len(reads) == 2 and min(reads) > 0.6 * max(reads), reads
