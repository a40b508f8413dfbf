from __future__ import annotations

from dualpath.policy.traces import default_traces, replay_traces
from dualpath.sim.conformance import SimTraceDriver


def test_recorded_traces_replay_through_the_sim_adapter() -> None:
    """Arrivals, fetch rounds, reads, prefills, completions and engine losses through the
    simulator's real PolicyAdapter (and real Req objects): the recorded plan sequences. Runs in
    the pure and the compiled build alike."""
    traces = default_traces()
    assert sum(len(t.plans) for t in traces) > 300
    mismatches = replay_traces(SimTraceDriver, traces)
    assert mismatches == [], mismatches[:1]


def test_sim_driver_started_every_assigned_request() -> None:
    trace = default_traces()[0]
    driver = SimTraceDriver(trace)
    from dualpath.policy.traces import play

    plans = play(driver, trace.events)
    placed = [a.request_id for kind, _n, p in plans if kind == "prefill" for a in p.assignments]
    assert [rid for rid, _pe in driver.started] == placed
