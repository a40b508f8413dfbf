"""The one link model of the project: a FIFO server per link direction with a priority lane.

A link direction serves transfers in booking order at its rate. Its state is two clocks:
``free_s``, when everything booked so far (both lanes) is done, and ``ctl_free_s``, when the
priority ("ctl": model / control) traffic booked so far is done. A ctl transfer starts once earlier
ctl transfers are done and pushes every later KV transfer back by its own duration (KV only gets
what is left: the paper's two virtual lanes, section 7); a KV transfer starts once everything
booked before it is done. ``free_s >= ctl_free_s`` always holds, so a KV transfer's end is
``max(ready, free_s) + duration``.

The simulator (``dualpath.sim.links``, booked in simulated seconds) and the runtime's emulated NICs
(``dualpath.runtime.cluster.traffic``, booked in ``time.monotonic`` seconds and shared between
processes) both book through this arithmetic; ``tests/core/test_links.py`` holds them to it.

A storage NIC carries reads (storage -> node) and persists (node -> storage). ``SNIC_DIRECTIONS``
names the two ways of modelling it: ``"shared"``, one link for both (half duplex), or
``"duplex"``, one link per direction. Both drivers take it as an option.
"""

from __future__ import annotations

LANES: tuple[str, ...] = ("ctl", "kv")
SNIC_DIRECTIONS: tuple[str, ...] = ("shared", "duplex")


def book(state: list[float], ready_s: float, duration_s: float, lane: str) -> float:
    """Book ``duration_s`` of transfer on ``lane`` ready at ``ready_s``; mutates ``state``
    (``[free_s, ctl_free_s]``) and returns when the transfer ends."""
    free_s, ctl_free_s = state
    if lane == "ctl":
        end = (ctl_free_s if ctl_free_s > ready_s else ready_s) + duration_s
        state[1] = end
        state[0] = (free_s if free_s > ready_s else ready_s) + duration_s
        return end
    end = (free_s if free_s > ready_s else ready_s) + duration_s
    state[0] = end
    return end
