"""Helpers shared by the policy tests: a P/D ledger of idle engines and a sink for fetch rounds."""

from __future__ import annotations

from dualpath.policy.ledger import DECODE, PREFILL, Entry, Ledger
from dualpath.policy.views import DecodePlan, PrefillPlan


def pd_ledger(pe_nodes: tuple[int, ...], de_nodes: tuple[int, ...], per_node: int) -> Ledger:
    """A ledger with ``per_node`` engines on each node (ids ``node * per_node + r``): PEs on
    ``pe_nodes`` with no HBM, DEs on ``de_nodes`` with room for 10**6 tokens each."""
    ledger = Ledger()
    ledger.add_engines(
        [
            (
                node * per_node + r,
                node,
                PREFILL if node in pe_nodes else DECODE,
                0 if node in pe_nodes else 10**6,
            )
            for node in pe_nodes + de_nodes
            for r in range(per_node)
        ]
    )
    return ledger


class PlanSink:
    """A Fetcher sink that keeps every applied prefill plan with the fetching node."""

    def __init__(self) -> None:
        self.prefill: list[tuple[int, PrefillPlan]] = []

    def decode_applied(self, node_id: int, plan: DecodePlan, assigned: list[Entry]) -> None:
        pass

    def prefill_applied(self, node_id: int, plan: PrefillPlan, assigned: list[Entry]) -> None:
        self.prefill.append((node_id, plan))
