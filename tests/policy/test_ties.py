"""The scheduler's two named tie-breaks (docs/policy.md, "Tie-breaks"; spec section 8 leaves them
open): ``read_tie`` (the side that reads under ``shorter`` on equal PE / DE read queues, default
"pe") and ``pe_tie`` (the order of least-loaded candidates of equal ``tok_e``, default "group":
group order; "read-queue": the smaller node read queue first). Each option changes a decision in
a hand-built case, on the view entry point and on the fetch kernels the simulator runs."""

from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError, DualpathError
from dualpath.policy import (
    EngineLoad,
    GroupLoad,
    NodeReadQueue,
    PendingPrefill,
    PrefillFetchView,
    RequestInfo,
    SchedulerConfig,
    make_scheduler,
)
from dualpath.policy.conformance import from_jsonable, to_jsonable
from dualpath.policy.fetch import SIM_ORDER, Fetcher
from dualpath.policy.prefill import choose_read

from .conftest import PlanSink, pd_ledger

PE_NODES, DE_NODES, PER_NODE = (0, 1), (2, 3), 2


def _config(**kw: object) -> SchedulerConfig:
    return SchedulerConfig(alpha_tokens=4000, beta_tokens=6000, block_size=64, **kw)  # type: ignore[arg-type]


def _pending(i: int, cached: int, de_node: int = 9) -> PendingPrefill:
    return PendingPrefill(
        request=RequestInfo(request_id=f"r{i}", cached_len=cached, new_len=10),
        de_engine_id=90,
        de_node_id=de_node,
    )


def test_bad_tie_values_are_rejected_naming_the_value() -> None:
    from dualpath.sim.config import SimConfig, get_system
    from dualpath.spec.clusters import DEFAULT_SIM_CLUSTER, get_cluster

    for key, bad in (("read_tie", "both"), ("pe_tie", "random"), ("read_tie", None)):
        with pytest.raises(ConfigError) as err:
            SchedulerConfig(**{key: bad})  # type: ignore[arg-type]
        assert f"{key}={bad!r}" in str(err.value) and "choices" in str(err.value), str(err.value)
    with pytest.raises(ConfigError, match="sideways"):
        SimConfig(
            system=get_system("dualpath"), cluster=get_cluster(DEFAULT_SIM_CLUSTER), read_tie="sideways"
        )
    with pytest.raises(ConfigError, match="coin"):
        SimConfig(system=get_system("dualpath"), cluster=get_cluster(DEFAULT_SIM_CLUSTER), pe_tie="coin")
    with pytest.raises(DualpathError, match="'middle'"):
        choose_read("shorter", 640, [0.0, 1.0], [0.0, 1.0], 64, "r", "middle")


def test_defaults_are_todays_and_old_config_dicts_load_with_them() -> None:
    config = SchedulerConfig()
    assert (config.read_tie, config.pe_tie) == ("pe", "group")
    data = to_jsonable(_config(read_tie="de", pe_tie="read-queue"))
    assert from_jsonable(data) == _config(read_tie="de", pe_tie="read-queue")
    del data["read_tie"], data["pe_tie"]  # a config recorded before the fields existed
    assert from_jsonable(data) == _config()


@pytest.mark.parametrize("policy", ["dualpath", "rr-shorter-queue"])
def test_read_tie_decides_equal_queues_only(policy: str) -> None:
    group = GroupLoad(group_id=0, node_id=0, engines=(EngineLoad(engine_id=0, num_seqs=0, num_tokens=0),))
    reads = (NodeReadQueue(node_id=0, read_queue_tokens=0), NodeReadQueue(node_id=9, read_queue_tokens=0))
    # r0: both queues empty (the tie); r1: the side r0 read on is now longer, so r1 reads on the other
    view = PrefillFetchView(
        now_s=0.0, groups=(group,), queue=(_pending(0, 640), _pending(1, 640)), read_queues=reads
    )
    sides = {}
    for tie in ("pe", "de"):
        plan = make_scheduler(policy, _config(read_tie=tie)).assign_prefill(view)
        sides[tie] = [a.read_side for a in plan.assignments]
    assert sides == {"pe": ["pe", "de"], "de": ["de", "pe"]}
    for tie in ("pe", "de"):  # unequal queues: the shorter side, whatever the tie
        assert choose_read("shorter", 640, [5.0, 1.0], [6.0, 1.0], 64, "r", tie)[0] == "pe"
        assert choose_read("shorter", 640, [6.0, 1.0], [5.0, 1.0], 64, "r", tie)[0] == "de"


def test_pe_tie_read_queue_prefers_the_emptier_node_on_equal_tok() -> None:
    """Two candidate groups (a central view), one idle PE each; node 0 already has reads queued
    (both nodes C2). Group order picks node 0's PE; "read-queue" node 1's."""
    groups = tuple(
        GroupLoad(group_id=g, node_id=g, engines=(EngineLoad(engine_id=g, num_seqs=0, num_tokens=0),))
        for g in (0, 1)
    )
    reads = (
        NodeReadQueue(node_id=0, read_queue_tokens=500),
        NodeReadQueue(node_id=1, read_queue_tokens=0),
        NodeReadQueue(node_id=9, read_queue_tokens=10**6),  # the DE side never wins here
    )
    view = PrefillFetchView(now_s=0.0, groups=groups, queue=(_pending(0, 640),), read_queues=reads)
    picked = {
        tie: make_scheduler("dualpath", _config(pe_tie=tie)).assign_prefill(view).assignments[0].engine_id
        for tie in ("group", "read-queue")
    }
    assert picked == {"group": 0, "read-queue": 1}


def _kernel_round(config: SchedulerConfig, *, pe_read_q: int, n: int) -> list[tuple[str, int, str]]:
    """One fetch round on a ledger (the fetch kernels, as in the simulator): ``n`` requests with a
    640-token hit, PE node 0's read queue at ``pe_read_q``; (request, PE node, read side) each."""
    ledger = pd_ledger(PE_NODES, DE_NODES, PER_NODE)
    ledger.read_q[0] = pe_read_q
    sched = make_scheduler("dualpath", config)
    sink = PlanSink()
    fetcher = Fetcher(ledger, sched, SIM_ORDER, sink, beta_tokens=config.beta_tokens)
    for i in range(n):
        ledger.arrive(RequestInfo(request_id=f"r{i}", cached_len=640, new_len=10, gen_len=10))
    fetcher.round(0.0)
    return sorted(
        (a.request_id, a.engine_id // PER_NODE, a.read_side)
        for _, plan in sink.prefill
        for a in plan.assignments
    )


def test_fetch_kernels_follow_both_ties() -> None:
    """The same options reach the fetch kernels (strict leader and central), not only the views."""
    base = _kernel_round(_config(), pe_read_q=0, n=1)
    de = _kernel_round(_config(read_tie="de"), pe_read_q=0, n=1)
    assert [s for *_, s in base] == ["pe"] and [s for *_, s in de] == ["de"]  # all queues empty: a tie
    central = {
        tie: _kernel_round(_config(pe_scope="central", pe_tie=tie), pe_read_q=100, n=1)[0][1]
        for tie in ("group", "read-queue")
    }
    assert central == {"group": 0, "read-queue": 1}
