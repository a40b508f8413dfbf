from __future__ import annotations

import pytest

from dualpath.sim.compiled import is_compiled
from dualpath.sim.config import SYSTEMS, SimConfig, get_system
from dualpath.policy.fetch import FetchOrder
from dualpath.policy.ledger import Ledger, ViewBounds
from dualpath.sim.driver import Simulation
from dualpath.sim.runner import make_agents, run_one, run_systems

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


def _run(cfg: SimConfig, trajs, order: FetchOrder | None = None,
         bounds: ViewBounds | None = None) -> dict:
    """One run with the adapter's fetch order / view bounds replaced (speed knobs under test)."""
    sim = Simulation(cfg, make_agents(trajs))
    if order is not None:
        sim.adapter.fetcher.order = order
    if bounds is not None:
        sim.adapter.ledger.bounds = bounds
    return sim.run()


def test_fetch_elision_does_not_change_results(make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(120, turns=6, first=8192, append=250, gen=24)
    cfg = SimConfig(system=get_system("dualpath"), cluster=make_cluster(1, 1))
    with_elision = _run(cfg, trajs)
    without = _run(cfg, trajs, order=FetchOrder(elide=False))
    assert with_elision["jct_s"] == without["jct_s"]
    assert with_elision["bytes"] == without["bytes"]
    # bounded queue prefixes in PE views (refetched when fully taken) give the same plans too
    tiny = _run(cfg, trajs, order=FetchOrder(elide=False), bounds=ViewBounds(prefill_prefix=2))
    assert tiny["jct_s"] == without["jct_s"] and tiny["bytes"] == without["bytes"]
    whole = _run(cfg, trajs, bounds=ViewBounds(prefill_prefix=None))
    assert whole["jct_s"] == without["jct_s"] and whole["bytes"] == without["bytes"]


@patches_methods
@pytest.mark.parametrize("system", ["dualpath", "basic"])
def test_bounded_private_queue_views_do_not_change_results(make_cluster, make_trajectories,
                                                          monkeypatch, system) -> None:
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
    bounded = _run(cfg, trajs, bounds=ViewBounds(private_full=0))
    assert sum(cuts) > len(cuts) // 2
    full = _run(cfg, trajs, bounds=ViewBounds(bound_private=False))
    for key in ("jct_s", "bytes", "mean_ttft_s", "mean_tpot_s", "events"):
        assert bounded[key] == full[key], key


@patches_methods
def test_basic_reads_wait_for_pe_hbm_room(make_cluster, make_trajectories, monkeypatch) -> None:
    """With calibration.BASIC_READS_NEED_HBM (off by default), Basic starts a PE read only when the
    PE's HBM holds the whole prompt: past the KV room only a lone request is held, reads did
    wait, every hold is given back, and layerwise prefill (same policy) is faster."""
    from dualpath.sim.driver import Simulation

    monkeypatch.setattr("dualpath.sim.calibration.BASIC_READS_NEED_HBM", True)
    room = 40_000  # a PE KV room of about two of these prompts, so the gate binds
    sims: list[Simulation] = []
    seen = {"waited": 0, "checks": 0}
    real_init, pump = Simulation.__init__, Simulation._pump_hbm

    def init(self, *a, **k):  # type: ignore[no-untyped-def]
        real_init(self, *a, **k)
        self.pe_kv_tokens = room
        sims.append(self)

    def watch(self, st):  # type: ignore[no-untyped-def]
        pump(self, st)
        held = sum(1 for r in st.queue if r.hbm_held)
        assert st.hbm_used <= room or held == 1, (st.hbm_used, held)
        seen["waited"] += bool(st.hbm_gate)
        seen["checks"] += 1

    monkeypatch.setattr(Simulation, "__init__", init)
    monkeypatch.setattr(Simulation, "_pump_hbm", watch)
    trajs = make_trajectories(160, turns=8, first=16384, append=200, gen=16)
    res = run_systems(["basic", "layerwise"], make_cluster(1, 2), trajs)
    basic = sims[0]
    assert seen["checks"] > 0 and seen["waited"] > 0
    assert all(st.hbm_used == 0 and not st.hbm_gate for st in basic.pe_states.values())
    assert res["basic"]["agents_finished"] == 160
    assert res["layerwise"]["jct_s"] < res["basic"]["jct_s"]


@patches_methods
def test_basic_run_cut_short_with_reads_waiting_for_hbm_keeps_invariants(make_cluster,
                                                                         make_trajectories,
                                                                         monkeypatch) -> None:
    """An online Basic run stopped while PE reads still wait for HBM room: those reads are not
    counted as read (the storage-bytes invariant holds) and some really were waiting."""
    from dualpath.sim.driver import Simulation
    from dualpath.sim.metrics import check_invariants

    monkeypatch.setattr("dualpath.sim.calibration.BASIC_READS_NEED_HBM", True)
    sims: list[Simulation] = []
    real_init = Simulation.__init__
    checked: list[int] = []

    def init(self, *a, **k):  # type: ignore[no-untyped-def]
        real_init(self, *a, **k)
        self.pe_kv_tokens = 20_000
        sims.append(self)

    def check(sim):  # type: ignore[no-untyped-def]
        checked.append(sum(len(st.hbm_gate) for st in sim.pe_states.values()))
        check_invariants(sim)

    monkeypatch.setattr(Simulation, "__init__", init)
    monkeypatch.setattr("dualpath.sim.metrics.check_invariants", check)
    trajs = make_trajectories(1000, turns=8, first=16384, append=200, gen=16)
    cfg = SimConfig(system=get_system("basic"), cluster=make_cluster(1, 2), aps=20.0, horizon_s=300.0,
                    max_sim_s=30.0)
    run_one(cfg, trajs)
    assert checked and checked[0] > 0
