"""The recorded conformance cases replay through the direct adapter; mismatches are caught."""

from __future__ import annotations

import msgspec

from dualpath.policy import PrefillPlan, SchedulerConfig
from dualpath.policy.cases.record import record_cases
from dualpath.policy.conformance import (
    DirectAdapter,
    default_cases,
    dumps_cases,
    loads_cases,
    replay,
)
from dualpath.policy.reference import Plan, View
from dualpath.policy.scheduler import POLICY_NAMES


def test_recorded_cases_cover_every_policy_and_kind() -> None:
    cases = default_cases()
    assert {c.policy for c in cases} == set(POLICY_NAMES)
    kinds = {s.kind for c in cases for s in c.steps}
    assert kinds == {"decode", "prefill", "batch"}
    assert sum(len(c.steps) for c in cases) > 200


def test_direct_adapter_conforms() -> None:
    assert replay(DirectAdapter()) == []


def test_recorder_reproduces_the_recorded_file() -> None:
    # The golden file is the policy's behaviour; re-record (python -m dualpath.policy.cases) only
    # with an intended policy change.
    assert dumps_cases(record_cases()) == dumps_cases(default_cases())


def test_json_round_trip() -> None:
    cases = default_cases()
    assert loads_cases(dumps_cases(cases)) == cases


class _PeOnlyAdapter:
    """A driver that 'forgot' DE-side reads: must be reported."""

    def run_step(self, *, policy: str, config: SchedulerConfig, kind: str, view: View) -> Plan:
        plan = DirectAdapter().run_step(policy=policy, config=config, kind=kind, view=view)
        if isinstance(plan, PrefillPlan):
            fixed = tuple(
                msgspec.structs.replace(
                    a, read_side="pe", pe_read_len=a.pe_read_len + a.de_read_len, de_read_len=0
                )
                for a in plan.assignments
            )
            return msgspec.structs.replace(plan, assignments=fixed)
        return plan


def test_wrong_adapter_is_caught() -> None:
    mismatches = replay(_PeOnlyAdapter())
    assert mismatches
    assert {m.kind for m in mismatches} == {"prefill"}
    assert not any(m.case.startswith("basic") for m in mismatches)
