"""The kernel entry points of a fetch (``policy.fetch_kernels``) give the view entry points' plans.

Two ledgers see the same random event sequence (arrivals, fetch rounds, reads, prefills and
decodes finishing); one Fetcher runs the kernels, the other builds every view and calls the
scheduler. Their plan sequences must be equal, plan for plan.
"""

from __future__ import annotations

import random

import pytest

from dualpath.policy.config import SchedulerConfig
from dualpath.policy.fetch import SIM_ORDER, Fetcher, FetchOrder
from dualpath.policy.ledger import DECODE, PREFILL, Entry, Ledger, ViewBounds
from dualpath.policy.scheduler import make_scheduler
from dualpath.policy.views import DecodePlan, PrefillPlan, RequestInfo


class _Log:
    def __init__(self) -> None:
        self.plans: list[tuple[str, int, DecodePlan | PrefillPlan]] = []

    def decode_applied(self, node_id: int, plan: DecodePlan, assigned: list[Entry]) -> None:
        self.plans.append(("decode", node_id, plan))

    def prefill_applied(self, node_id: int, plan: PrefillPlan, assigned: list[Entry]) -> None:
        self.plans.append(("prefill", node_id, plan))


def _fetcher(
    policy: str,
    bounds: ViewBounds,
    order: FetchOrder,
    kernel: bool,
    scope: str = "central",
    read_tie: str = "pe",
    pe_tie: str = "group",
) -> Fetcher:
    ledger = Ledger(bounds=bounds)
    engines = []
    for node in range(6):  # nodes 0-2 PE groups, 3-5 DE groups, 3 engines each
        for rank in range(3):
            role = PREFILL if node < 3 else DECODE
            engines.append((node * 3 + rank, node, role, 5_000 if role == DECODE else 0))
    ledger.add_engines(engines)
    for node in range(6):
        ledger.set_read_rate(100.0 + 40 * node, node)
    sched = make_scheduler(
        policy,
        SchedulerConfig(
            alpha_tokens=3_000,
            beta_tokens=4_000,
            block_size=16,
            pe_scope=scope,
            read_tie=read_tie,
            pe_tie=pe_tie,
        ),
    )
    fetcher = Fetcher(ledger, sched, order, _Log(), beta_tokens=sched.config.beta_tokens)
    if not kernel:
        fetcher.slack, fetcher.prefill_kernel = -1.0, False
    else:
        assert fetcher.slack > 0 and fetcher.prefill_kernel
    return fetcher


def _replay(fetcher: Fetcher, seed: int) -> list:
    rng = random.Random(seed)
    ledger = fetcher.ledger
    live: list[str] = []
    for step in range(400):
        for _ in range(rng.randrange(4)):
            rid = f"r{step}-{len(live)}-{rng.randrange(1 << 20)}"
            ledger.arrive(
                RequestInfo(
                    request_id=rid,
                    cached_len=16 * rng.randrange(60),
                    new_len=rng.randrange(1, 900),
                    gen_len=rng.randrange(300),
                )
            )
            live.append(rid)
        fetcher.round(step * 0.05)
        for rid in list(live):
            entry = ledger.requests[rid]
            if entry.pe < 0:
                continue
            roll = rng.random()
            if roll < 0.3:
                ledger.on_read_done(rid, rng.choice([None, *entry.reads]))
            elif roll < 0.5:
                ledger.on_prefill_done(rid)
            elif roll < 0.65:
                ledger.on_finished(rid)
                live.remove(rid)
    return fetcher.sink.plans  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy", ["dualpath", "dualpath-split"])
@pytest.mark.parametrize(
    "bounds", [ViewBounds(), ViewBounds(prefill_prefix=3, private_full=1, all_read_queues_up_to=2)]
)
@pytest.mark.parametrize("order", [SIM_ORDER, FetchOrder(elide=False, dirty_only=False)])
@pytest.mark.parametrize("scope", ["central", "group"])
def test_kernel_plans_equal_view_plans(
    policy: str, bounds: ViewBounds, order: FetchOrder, scope: str
) -> None:
    for seed in range(3):
        kernel = _replay(_fetcher(policy, bounds, order, kernel=True, scope=scope), seed)
        view = _replay(_fetcher(policy, bounds, order, kernel=False, scope=scope), seed)
        assert len(kernel) > 100
        assert sum(1 for kind, _n, p in kernel if kind == "prefill" and p.assignments) > 20
        assert kernel == view
        # Which groups' PEs a fetch assigned to: its own only ("group"), any ("central": some
        # fetch of this replay assigns to another group's PE; engine e is on node e // 3).
        foreign = [
            a.engine_id
            for kind, node, p in kernel
            if kind == "prefill"
            for a in p.assignments
            if a.engine_id // 3 != node
        ]
        assert (len(foreign) > 0) == (scope == "central")


@pytest.mark.parametrize("scope", ["central", "group"])
def test_kernel_plans_equal_view_plans_under_the_other_tie_breaks(scope: str) -> None:
    """``read_tie="de"`` / ``pe_tie="read-queue"`` (docs/policy.md, "Tie-breaks"): the kernels
    still give the view entry point's plans, and the replay's plans differ from the defaults'."""
    ties = {"read_tie": "de", "pe_tie": "read-queue"}
    for seed in range(2):
        kernel = _replay(_fetcher("dualpath", ViewBounds(), SIM_ORDER, True, scope, **ties), seed)
        view = _replay(_fetcher("dualpath", ViewBounds(), SIM_ORDER, False, scope, **ties), seed)
        assert kernel == view
        assert kernel != _replay(_fetcher("dualpath", ViewBounds(), SIM_ORDER, True, scope), seed)
