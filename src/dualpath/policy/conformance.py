"""Conformance harness: recorded views and the plans they must give, replayed through a driver.

A driver (simulator, runtime) proves it makes the policy's decisions by replaying the recorded
cases through its :class:`ConformanceAdapter`: for each step the adapter turns the recorded view
into its own state, builds the view back with its own code, calls the scheduler and returns the
plan. :func:`replay` lists every step whose plan differs from the recorded one.

Cases are JSON (``cases/conformance_v1.json`` in this package; regenerate with
``python -m dualpath.policy.cases``). This module reads that one packaged file and nothing else.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, is_dataclass
from importlib import resources
from typing import Any, Protocol

import msgspec

from dualpath.core.errors import DualpathError
from dualpath.policy import views as _views
from dualpath.policy.config import SchedulerConfig
from dualpath.policy.predictor import AttentionFlops, LinearAttentionPredictor
from dualpath.policy.reference import Plan, View
from dualpath.policy.scheduler import make_scheduler

CASES_FILE = "conformance_v1.json"
KINDS: tuple[str, ...] = ("decode", "prefill", "batch")

_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        _views.RequestInfo,
        _views.EngineLoad,
        _views.NodeReadQueue,
        _views.GroupLoad,
        _views.GroupTotal,
        _views.DecodeFetchView,
        _views.GroupRouting,
        _views.DecodeAssignment,
        _views.DecodePlan,
        _views.PendingPrefill,
        _views.PrefillFetchView,
        _views.PrefillAssignment,
        _views.PrefillPlan,
        _views.BatchItem,
        _views.BatchView,
        _views.BatchEntry,
        _views.BatchPlan,
        SchedulerConfig,
        AttentionFlops,
        LinearAttentionPredictor,
    )
}


def register(*classes: type) -> None:
    """Make more frozen dataclasses (de)serialisable by :func:`to_jsonable` (traces use it)."""
    for cls in classes:
        _TYPES[cls.__name__] = cls


def to_jsonable(obj: Any) -> Any:
    """Policy records (views, plans: ``msgspec.Struct``; configs: dataclasses) -> plain JSON values
    (``{"type": name, field: value...}``)."""
    names: tuple[str, ...] | None = None
    if isinstance(obj, msgspec.Struct):
        names = obj.__struct_fields__
    elif is_dataclass(obj) and not isinstance(obj, type):
        names = tuple(f.name for f in fields(obj))
    if names is not None:
        name = type(obj).__name__
        if name not in _TYPES:
            raise DualpathError(f"can not serialise {name}; known types: {', '.join(_TYPES)}")
        out: dict[str, Any] = {"type": name}
        for field in names:
            out[field] = to_jsonable(getattr(obj, field))
        return out
    if isinstance(obj, (tuple, list)):
        return [to_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise DualpathError(f"can not serialise {type(obj).__name__}: {obj!r}")


def from_jsonable(data: Any) -> Any:
    """Inverse of :func:`to_jsonable` (lists become tuples)."""
    if isinstance(data, dict):
        cls = _TYPES.get(data.get("type", ""))
        if cls is None:
            raise DualpathError(f"unknown type {data.get('type')!r}; known: {', '.join(_TYPES)}")
        return cls(**{k: from_jsonable(v) for k, v in data.items() if k != "type"})
    if isinstance(data, list):
        return tuple(from_jsonable(v) for v in data)
    return data


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One call: ``kind`` ("decode" | "prefill" | "batch"), its view and the plan it must give."""

    kind: str
    view: View
    plan: Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """A named sequence of steps for one policy and config."""

    name: str
    policy: str
    config: SchedulerConfig
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Mismatch:
    case: str
    step_index: int
    kind: str
    expected: Plan
    actual: object


class ConformanceAdapter(Protocol):
    """A driver's bridge: from a recorded view, set up the driver's own state, build the view with
    the driver's own code, call the scheduler (``make_scheduler(policy, config)``), return the
    plan. Adapters must not pass the recorded view straight through (except DirectAdapter)."""

    def run_step(self, *, policy: str, config: SchedulerConfig, kind: str, view: View) -> Plan: ...


class DirectAdapter:
    """The policy itself, no driver: the reference every adapter must agree with."""

    def run_step(self, *, policy: str, config: SchedulerConfig, kind: str, view: View) -> Plan:
        sched = make_scheduler(policy, config)
        if kind == "decode" and isinstance(view, _views.DecodeFetchView):
            return sched.assign_decode(view)
        if kind == "prefill" and isinstance(view, _views.PrefillFetchView):
            return sched.assign_prefill(view)
        if kind == "batch" and isinstance(view, _views.BatchView):
            return sched.plan_prefill_batch(view)
        raise DualpathError(f"step kind {kind!r} does not match view {type(view).__name__}")


def same_plan(expected: object, actual: object) -> bool:
    """Equal as JSON values, floats within a relative 1e-9 (attention_s)."""
    return _same(to_jsonable(expected), to_jsonable(actual))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and type(a) is type(b)


def replay(adapter: ConformanceAdapter, cases: tuple[Case, ...] | None = None) -> list[Mismatch]:
    """Run every recorded step through ``adapter``; return the steps whose plan differs (empty =
    conforms). ``cases`` defaults to the packaged recorded cases."""
    todo = default_cases() if cases is None else cases
    out: list[Mismatch] = []
    for case in todo:
        for i, step in enumerate(case.steps):
            actual = adapter.run_step(policy=case.policy, config=case.config, kind=step.kind, view=step.view)
            if not same_plan(step.plan, actual):
                out.append(
                    Mismatch(case=case.name, step_index=i, kind=step.kind, expected=step.plan, actual=actual)
                )
    return out


def dumps_cases(cases: tuple[Case, ...]) -> str:
    body = [
        {
            "name": c.name,
            "policy": c.policy,
            "config": to_jsonable(c.config),
            "steps": [
                {"kind": s.kind, "view": to_jsonable(s.view), "plan": to_jsonable(s.plan)} for s in c.steps
            ],
        }
        for c in cases
    ]
    return json.dumps({"version": 1, "cases": body}, separators=(",", ":"), sort_keys=True)


def loads_cases(text: str) -> tuple[Case, ...]:
    data = json.loads(text)
    if data.get("version") != 1:
        raise DualpathError(f"conformance cases version {data.get('version')!r}; expected 1")
    return tuple(
        Case(
            name=c["name"],
            policy=c["policy"],
            config=from_jsonable(c["config"]),
            steps=tuple(
                Step(kind=s["kind"], view=from_jsonable(s["view"]), plan=from_jsonable(s["plan"]))
                for s in c["steps"]
            ),
        )
        for c in data["cases"]
    )


def default_cases() -> tuple[Case, ...]:
    """The recorded cases shipped with the package."""
    text = resources.files("dualpath.policy.cases").joinpath(CASES_FILE).read_text("utf-8")
    return loads_cases(text)
