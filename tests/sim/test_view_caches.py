"""The simulator's speed caches (handle-free events, cached policy views) change nothing."""

from __future__ import annotations

from dualpath.policy.views import EngineLoad, GroupLoad, GroupTotal
from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.driver import Simulation
from dualpath.sim.harness.runner import make_agents
from dualpath.sim.kernel import PRIO_COMPLETE, PRIO_FETCH, Kernel


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


def _fresh_group(ledger, node, de: bool) -> GroupLoad:
    engines = [ledger.engines[g] for g in node.gpus]
    return GroupLoad(
        group_id=node.node_id,
        node_id=node.node_id,
        engines=tuple(
            EngineLoad(
                engine_id=e.engine_id,
                num_seqs=e.num_seqs,
                num_tokens=e.num_tokens,
                free_hbm_tokens=(e.hbm_tokens - e.reserved_tokens) if de else 0,
            )
            for e in engines
        ),
    )


def test_cached_views_equal_freshly_built_ones(make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(24)
    sim = Simulation(SimConfig(system=get_system("dualpath"), cluster=make_cluster()), make_agents(trajs))
    ledger = sim.adapter.ledger
    checks = []

    def check() -> None:  # every 50 ms of simulated time, mid-run
        now = sim.kernel.now_s
        for node in sim.cluster.de_nodes:
            view = ledger.decode_view(node.node_id, now)
            assert view.group == _fresh_group(ledger, node, True)
            assert view.group_totals == tuple(
                GroupTotal(
                    group_id=n.node_id,
                    num_tokens=sum(ledger.engines[g].num_tokens for g in n.gpus)
                    + sum(e.decode_len for e in ledger.private[n.node_id]),
                )
                for n in sim.cluster.de_nodes
            )
        for node in sim.cluster.pe_nodes:
            view = ledger.prefill_view(node.node_id, now)
            assert view.groups == (_fresh_group(ledger, node, False),)
            assert all(q.read_queue_tokens == sim.cluster.nodes[q.node_id].read_q for q in view.read_queues)
        checks.append(now)
        if sim.agents_left:
            sim.kernel.call_at(sim.kernel.now_s + 0.05, check, PRIO_FETCH)

    sim.kernel.call_at(0.25, check, PRIO_FETCH)
    result = sim.run()
    assert result["agents_finished"] == 24
    assert len(checks) > 20
