from __future__ import annotations

from dualpath.policy.conformance import default_cases, replay
from dualpath.sim.conformance import SimConformanceAdapter


def test_recorded_cases_replay_through_the_sim_adapter() -> None:
    cases = default_cases()
    assert sum(len(c.steps) for c in cases) > 50
    mismatches = replay(SimConformanceAdapter(), cases)
    assert mismatches == [], mismatches[:3]
