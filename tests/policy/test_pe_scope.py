"""PE scope (docs/policy.md): "group" (the registered policies' default: strict leader fetch)
offers a PE fetch only the fetching group's engines, "central" every live PE group's.

The flood case of docs/fidelity.md (session 13): many cache-less first turns queued at once, the
first PE group to fetch takes all of them under "group"; under "central" the fetch spreads them over
every PE group, and C2 / C3 (the *node's* read queue) steers them away from a congested node.
"""

from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError
from dualpath.policy import POLICY_NAMES, RequestInfo, SchedulerConfig, make_scheduler
from dualpath.policy.fetch import SIM_ORDER, Fetcher
from dualpath.policy.ledger import CENTRAL
from dualpath.policy.scheduler import POLICIES

from .conftest import PlanSink, pd_ledger

PE_NODES, DE_NODES, PER_NODE = (0, 1), (2, 3), 4


def _flood(policy: str, scope: str | None, *, congested: int | None = None, n: int = 16) -> dict[int, int]:
    """``n`` first turns (no hit) queued, one fetch round; requests placed per PE node."""
    ledger = pd_ledger(PE_NODES, DE_NODES, PER_NODE)
    if congested is not None:  # a read already queued on that PE node: its PEs are class C3
        ledger.read_q[congested] = 10_000
    config = SchedulerConfig(alpha_tokens=5_000, beta_tokens=50_000, pe_scope=scope)
    sched = make_scheduler(policy, config)
    sink = PlanSink()
    fetcher = Fetcher(ledger, sched, SIM_ORDER, sink, beta_tokens=config.beta_tokens)
    for i in range(n):
        ledger.arrive(RequestInfo(request_id=f"r{i}", cached_len=0, new_len=1_000, gen_len=10))
    fetcher.round(0.0)  # DE fetches route and assign; then the PE groups fetch
    per_node = dict.fromkeys(PE_NODES, 0)
    for entry in ledger.requests.values():
        if entry.pe >= 0:
            per_node[entry.pe // PER_NODE] += 1
    assert sum(per_node.values()) == n  # beta leaves room for all of them either way
    return per_node


@pytest.mark.parametrize("policy", ["dualpath", "basic"])
def test_group_scope_gives_the_first_fetching_group_the_whole_flood(policy: str) -> None:
    placed = _flood(policy, "group")
    assert sorted(placed.values()) == [0, 16]


@pytest.mark.parametrize("policy", ["dualpath", "basic"])
def test_central_scope_spreads_the_flood_over_every_group(policy: str) -> None:
    assert _flood(policy, "central") == {0: 8, 1: 8}
    assert sorted(_flood(policy, None).values()) == [0, 16]  # the default: "group"


def test_central_classes_avoid_a_read_congested_node() -> None:
    # C2 before C3: node 0's read queue is over alpha, so every first turn goes to node 1 while
    # its PEs stay under beta (with "group" the classes could not choose: one node's PEs only).
    for congested, free in ((0, 1), (1, 0)):
        placed = _flood("dualpath", "central", congested=congested)
        assert placed == {congested: 0, free: 16}


def test_central_round_robin_uses_one_cursor_over_every_pe() -> None:
    ledger = pd_ledger(PE_NODES, DE_NODES, PER_NODE)
    sched = make_scheduler("basic", SchedulerConfig(beta_tokens=10**6, pe_scope="central"))
    sink = PlanSink()
    fetcher = Fetcher(ledger, sched, SIM_ORDER, sink, beta_tokens=10**6)
    engines: list[int] = []
    for step in range(3):
        for i in range(3):
            ledger.arrive(RequestInfo(request_id=f"s{step}-{i}", cached_len=0, new_len=100, gen_len=1))
        fetcher.round(0.05 * step)
        engines += [a.engine_id for _node, plan in sink.prefill for a in plan.assignments]
        sink.prefill.clear()
    assert engines == [0, 1, 2, 3, 4, 5, 6, 7, 0]  # one rotation over both groups' 8 PEs
    assert ledger.pe_rr == {CENTRAL: 1}  # no per-group cursor


def test_every_registered_policy_defaults_to_group_and_config_overrides() -> None:
    # (session 14: central failed the fidelity gate, docs/fidelity.md; it is the named option)
    assert {name: POLICIES[name].pe_scope for name in POLICY_NAMES} == dict.fromkeys(POLICY_NAMES, "group")
    assert make_scheduler("dualpath").pe_scope == "group"
    assert make_scheduler("dualpath", SchedulerConfig(pe_scope="central")).pe_scope == "central"
    with pytest.raises(ConfigError, match="pe_scope"):
        SchedulerConfig(pe_scope="global")
