from __future__ import annotations

import pytest

from dualpath.policy.conformance import default_cases, replay
from dualpath.sim.compiled import is_compiled
from dualpath.sim.conformance import SimConformanceAdapter


# The conformance adapter drives PolicyAdapter with duck-typed stand-ins for the simulator's state,
# which a mypyc-compiled (runtime type-checked) PolicyAdapter rejects. The compiled adapter is the
# same source; tests/sim/test_compiled_build.py checks it gives bit-identical runs.
@pytest.mark.skipif(is_compiled(), reason="duck-typed stand-ins; compiled adapter checks types")
def test_recorded_cases_replay_through_the_sim_adapter() -> None:
    cases = default_cases()
    assert sum(len(c.steps) for c in cases) > 50
    mismatches = replay(SimConformanceAdapter(), cases)
    assert mismatches == [], mismatches[:3]
