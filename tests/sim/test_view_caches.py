"""The simulator's speed caches (handle-free events, cached policy views) change nothing."""

from __future__ import annotations

from dualpath.policy.views import EngineLoad, GroupLoad, GroupTotal
from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.driver import Simulation
from dualpath.sim.kernel import PRIO_COMPLETE, PRIO_FETCH, Kernel
from dualpath.sim.harness.runner import make_agents


def test_call_at_shares_order_with_at_and_counts_events() -> None:
    k = Kernel()
    seen: list[str] = []
    k.call_at(1.0, lambda: seen.append("a"), PRIO_COMPLETE)
    h = k.at(1.0, lambda: seen.append("dead"), PRIO_COMPLETE)
    k.at(1.0, lambda: seen.append("b"), PRIO_COMPLETE)
    k.call_at(1.0, lambda: seen.append("c"), PRIO_COMPLETE)
    k.call_at(1.0, lambda: seen.append("fetch"), PRIO_FETCH)
    h.cancel()
    assert k.pending == 4
    k.run(until_s=0.5)
    assert seen == [] and k.events == 0
    k.run()
    assert seen == ["a", "b", "c", "fetch"] and k.events == 4 and k.pending == 0


def _fresh_group(node, states, de: bool) -> GroupLoad:
    return GroupLoad(group_id=node.node_id, node_id=node.node_id, engines=tuple(
        EngineLoad(engine_id=g, num_seqs=states[g].seq, num_tokens=states[g].tok,
                   free_hbm_tokens=(states[g].hbm_tokens - states[g].reserved) if de else 0)
        for g in node.gpus))


def test_cached_views_equal_freshly_built_ones(make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(24)
    sim = Simulation(SimConfig(system=get_system("dualpath"), cluster=make_cluster()),
                     make_agents(trajs))
    adapter = sim.adapter
    checks = []

    def check() -> None:  # every 50 ms of simulated time, mid-run
        for node in sim.cluster.de_nodes:
            view = adapter.decode_view(node)
            assert view.group == _fresh_group(node, sim.de_states, True)
            assert view.group_totals == tuple(
                GroupTotal(group_id=n, num_tokens=sim.de_node_tok[n] + adapter.private_tokens[n])
                for n in adapter.de_node_ids)
        for node in sim.cluster.pe_nodes:
            view = adapter.prefill_view(node)
            assert view.groups == (_fresh_group(node, sim.pe_states, False),)
            assert all(q.read_queue_tokens == sim.cluster.nodes[q.node_id].read_q
                       for q in view.read_queues)
        checks.append(sim.kernel.now_s)
        if sim.agents_left:
            sim.kernel.call_at(sim.kernel.now_s + 0.05, check, PRIO_FETCH)

    sim.kernel.call_at(0.25, check, PRIO_FETCH)
    result = sim.run()
    assert result["agents_finished"] == 24
    assert len(checks) > 20
