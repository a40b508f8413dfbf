"""``python -m dualpath.policy.cases [PATH]``: re-record the conformance cases and, next to them,
the event traces (developer tool).

Only run this when a policy change is intended; commit the new JSON with the change."""

from __future__ import annotations

import sys
from pathlib import Path

from dualpath.policy.cases.record import record_cases
from dualpath.policy.cases.traces import record_traces
from dualpath.policy.conformance import CASES_FILE, dumps_cases
from dualpath.policy.traces import TRACES_FILE, dumps_traces

if __name__ == "__main__":
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        sys.exit(__doc__)
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name(CASES_FILE)
    cases = record_cases()
    target.write_text(dumps_cases(cases) + "\n", encoding="utf-8")
    print(f"wrote {sum(len(c.steps) for c in cases)} steps in {len(cases)} cases to {target}")
    traces = record_traces()
    path = target.with_name(TRACES_FILE)
    path.write_text(dumps_traces(traces) + "\n", encoding="utf-8")
    print(f"wrote {sum(len(t.events) for t in traces)} events in {len(traces)} traces to {path}")
