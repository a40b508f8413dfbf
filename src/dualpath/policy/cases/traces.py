"""Records conformance traces: each policy and fetch order drives a small ReferenceDriver through a
seeded random event sequence (arrivals, fetch rounds, reads, prefills, completions, a DE engine
lost, a PE engine lost, then a whole DE group lost). Deterministic: same seed, same traces."""

from __future__ import annotations

import random
from collections.abc import Callable

from dualpath.policy.cases.record import case_config
from dualpath.policy.fetch import RUNTIME_ORDER, SIM_ORDER, FetchOrder
from dualpath.policy.ledger import Ledger, ViewBounds
from dualpath.policy.reference import ReferenceDriver
from dualpath.policy.scheduler import POLICY_NAMES, make_scheduler
from dualpath.policy.traces import Event, PlanRecord, Trace, feed
from dualpath.policy.views import RequestInfo

ORDERS: dict[str, FetchOrder] = {"sim": SIM_ORDER, "runtime": RUNTIME_ORDER}
BOUNDS = ViewBounds(prefill_prefix=3, private_full=2)  # small, so the cut-and-refetch paths run


def trace_scenario(
    policy: str, order_name: str, seed: int, rounds: int = 15, pe_scope: str | None = None
) -> Trace:
    """``pe_scope``: the config's (None: the policy's default); a trace with one is named for it."""
    rng = random.Random(seed)
    config = case_config(pe_scope=pe_scope)
    order = ORDERS[order_name]
    p, d, e = 2, 3, 2
    driver = ReferenceDriver(
        make_scheduler(policy, config),
        num_pe_groups=p,
        num_de_groups=d,
        engines_per_group=e,
        de_hbm_tokens=9_000,
        read_tokens_per_s=1000.0,
        order=order,
        bounds=BOUNDS,
    )
    ledger = driver.ledger
    events: list[Event] = []

    def emit(ev: Event) -> None:
        events.append(ev)
        feed(driver, ev)

    losses = {
        rounds // 3: [p * e + e * 1],  # a DE of group p + 1
        rounds // 2: [1],  # a PE of group 0
        2 * rounds // 3: [(p + 2) * e + r for r in range(e)],
    }  # all of DE group p + 2
    count = 0
    for r in range(rounds):
        t = 0.05 * (r + 1)
        count = _arrivals(rng, t, count, emit)
        emit(Event(kind="tick", t=t))
        _progress(ledger, rng, t, emit)
        for eid in losses.get(r, ()):
            emit(Event(kind="engine_lost", t=t, engine_id=eid))
    plans = tuple(PlanRecord(kind=k, node_id=n, plan=pl) for k, n, pl in driver.applied)
    return Trace(
        name=f"{policy}{'-' + pe_scope if pe_scope else ''}-{order_name}-{seed}",
        policy=policy,
        config=config,
        order=order,
        bounds=BOUNDS,
        num_pe_groups=p,
        num_de_groups=d,
        engines_per_group=e,
        de_hbm_tokens=9_000,
        read_tokens_per_s=1000.0,
        events=tuple(events),
        plans=plans,
    )


def _arrivals(rng: random.Random, t: float, count: int, emit: Callable[[Event], None]) -> int:
    """0..5 random arrivals at ``t`` (ids from ``count``); the next free id."""
    for _ in range(rng.randint(0, 5)):
        emit(
            Event(
                kind="arrive",
                t=t,
                request=RequestInfo(
                    request_id=f"{count}:0",
                    cached_len=64 * rng.randint(0, 40),
                    new_len=rng.randint(1, 600),
                    gen_len=rng.randint(1, 200),
                ),
            )
        )
        count += 1
    return count


def _progress(ledger: Ledger, rng: random.Random, t: float, emit: Callable[[Event], None]) -> None:
    """Random completions at ``t`` of each placed request's next step (reads, prefill, decode)."""
    for rid, entry in list(ledger.requests.items()):
        if entry.pe < 0:
            continue
        if entry.reads and rng.random() < 0.6:
            for node in sorted(entry.reads):
                emit(Event(kind="read_done", t=t, request_id=rid, node_id=node))
        elif not entry.reads and not entry.pe_done and rng.random() < 0.5:
            emit(Event(kind="prefill_done", t=t, request_id=rid))
        elif entry.pe_done and rng.random() < 0.4:
            emit(Event(kind="finished", t=t, request_id=rid))


def record_traces(seed: int = 0) -> tuple[Trace, ...]:
    """Every policy in one fetch order (alternating), dualpath in both; then basic and dualpath
    with ``pe_scope="central"`` (every PE group a candidate) in the simulator's order."""
    names = list(ORDERS)
    out = [trace_scenario(policy, names[i % 2], seed + i) for i, policy in enumerate(POLICY_NAMES)]
    out.append(trace_scenario("dualpath", names[(POLICY_NAMES.index("dualpath") + 1) % 2], seed))
    out += [trace_scenario(p, "sim", seed, pe_scope="central") for p in ("basic", "dualpath")]
    return tuple(out)
