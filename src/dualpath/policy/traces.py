"""Conformance as event sequences: recorded traces every driver must replay to the same plans.

A :class:`Trace` is a small cluster (PE groups are nodes ``0..P-1``, DE groups the next ``D``;
engine ids ``node * engines_per_group + rank``), a policy, a ``FetchOrder``, ``ViewBounds``
and a list of :class:`Event` s: arrivals, fetch rounds (``tick``), reads done, prefills done,
requests finished, engines lost (what becomes of their requests is the runtime scheduler's rule,
``policy.recovery``, applied by ``policy.recovery.lose_engine``: nothing streams in a trace, so a request is
requeued the first time an engine of its is lost and fails, leaving the ledger, the second time;
then the engine leaves). ``plans`` are the ``(kind, node, plan)`` every applied plan of the recording, in order.
A driver replays a trace through its own adapter (:class:`TraceDriver`) and must produce the same
sequence (:func:`replay_traces`). Cases: ``cases/traces_v1.json``, recorded by
``python -m dualpath.policy.cases``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from dualpath.core.errors import DualpathError
from dualpath.policy.config import SchedulerConfig
from dualpath.policy.conformance import from_jsonable, register, same_plan, to_jsonable
from dualpath.policy.fetch import FetchOrder
from dualpath.policy.ledger import ViewBounds
from dualpath.policy.views import DecodePlan, PrefillPlan, RequestInfo

TRACES_FILE = "traces_v1.json"
EVENT_KINDS: tuple[str, ...] = ("arrive", "tick", "read_done", "prefill_done", "finished", "engine_lost")


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One thing that happened at ``t``: ``arrive`` (``request``), ``tick`` (a fetch round),
    ``read_done`` (``request_id``'s read on ``node_id``), ``prefill_done`` / ``finished``
    (``request_id``), ``engine_lost`` (``engine_id``)."""

    kind: str
    t: float = 0.0
    request: RequestInfo | None = None
    request_id: str = ""
    node_id: int = -1
    engine_id: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRecord:
    kind: str  # "decode" | "prefill"
    node_id: int
    plan: DecodePlan | PrefillPlan


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    name: str
    policy: str
    config: SchedulerConfig
    order: FetchOrder
    bounds: ViewBounds
    num_pe_groups: int
    num_de_groups: int
    engines_per_group: int
    de_hbm_tokens: int
    read_tokens_per_s: float
    events: tuple[Event, ...]
    plans: tuple[PlanRecord, ...]

    def engines(self) -> list[tuple[int, int, str]]:
        """``(engine_id, node_id, "pe" | "de")`` of the trace's cluster."""
        e, p = self.engines_per_group, self.num_pe_groups
        return [
            (node * e + r, node, "pe" if node < p else "de")
            for node in range(p + self.num_de_groups)
            for r in range(e)
        ]


register(Event, PlanRecord, Trace, FetchOrder, ViewBounds)


class TraceDriver(Protocol):
    """A driver's bridge for traces: its own adapter and state, fed the trace's events."""

    def arrive(self, request: RequestInfo) -> None: ...

    def tick(self, now_s: float) -> None: ...

    def read_done(self, request_id: str, node_id: int) -> None: ...

    def prefill_done(self, request_id: str) -> None: ...

    def finished(self, request_id: str) -> None: ...

    def engine_lost(self, engine_id: int) -> None: ...

    def plans(self) -> list[tuple[str, int, DecodePlan | PrefillPlan]]: ...


def feed(driver: TraceDriver, ev: Event) -> None:
    """Hand one event to ``driver`` (its method of that kind); DualpathError on a bad event."""
    if ev.kind == "arrive":
        if ev.request is None:
            raise DualpathError("arrive event without a request")
        driver.arrive(ev.request)
    elif ev.kind == "tick":
        driver.tick(ev.t)
    elif ev.kind == "read_done":
        driver.read_done(ev.request_id, ev.node_id)
    elif ev.kind == "prefill_done":
        driver.prefill_done(ev.request_id)
    elif ev.kind == "finished":
        driver.finished(ev.request_id)
    elif ev.kind == "engine_lost":
        driver.engine_lost(ev.engine_id)
    else:
        raise DualpathError(f"event kind {ev.kind!r}; choices: {', '.join(EVENT_KINDS)}")


def play(driver: TraceDriver, events: tuple[Event, ...]) -> list[tuple[str, int, Any]]:
    """Feed ``events`` to ``driver``; returns its applied plans."""
    for ev in events:
        feed(driver, ev)
    return driver.plans()


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceMismatch:
    trace: str
    index: int  # first plan that differs (or where one sequence ends)
    expected: object
    actual: object


def replay_traces(
    make_driver: Callable[[Trace], TraceDriver], traces: tuple[Trace, ...] | None = None
) -> list[TraceMismatch]:
    """Replay every trace through a fresh driver; the traces whose plan sequence differs."""
    out: list[TraceMismatch] = []
    for trace in default_traces() if traces is None else traces:
        got = play(make_driver(trace), trace.events)
        want = [(p.kind, p.node_id, p.plan) for p in trace.plans]
        for i in range(max(len(got), len(want))):
            a = got[i] if i < len(got) else None
            b = want[i] if i < len(want) else None
            if a is None or b is None or a[:2] != b[:2] or not same_plan(b[2], a[2]):
                out.append(TraceMismatch(trace=trace.name, index=i, expected=b, actual=a))
                break
    return out


def dumps_traces(traces: tuple[Trace, ...]) -> str:
    return json.dumps(
        {"version": 1, "traces": [to_jsonable(t) for t in traces]}, separators=(",", ":"), sort_keys=True
    )


def loads_traces(text: str) -> tuple[Trace, ...]:
    data = json.loads(text)
    if data.get("version") != 1:
        raise DualpathError(f"conformance traces version {data.get('version')!r}; expected 1")
    return tuple(from_jsonable(t) for t in data["traces"])


def default_traces() -> tuple[Trace, ...]:
    """The recorded traces shipped with the package."""
    text = resources.files("dualpath.policy.cases").joinpath(TRACES_FILE).read_text("utf-8")
    return loads_traces(text)
