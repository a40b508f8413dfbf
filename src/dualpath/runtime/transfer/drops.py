"""Counting what a process refuses to act on: dropped control- and data-plane messages.

Every message a process decodes is validated field by field (msgspec types and ranges, then the
receiver's own checks against what it knows: registered engines, assigned requests, bound
endpoints). One that fails is dropped, never raised: ``DropCounter.drop(plane, cause, detail)``
counts it per ``(plane, cause)`` and logs the first of each cause (a flood of garbage writes one
line, not millions). Engines report their counts in heartbeats; the scheduler adds its own and
serves the sum as ``MetricsSnapshot.messages_dropped``; ``/metrics`` exposes it as
``dualpath_messages_dropped_total{plane, cause}``. Thread-safe.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("dualpath.drops")

PLANES = ("control", "data")


class DropCounter:
    """Dropped messages of one process (``who`` names it in the log), per ``"plane/cause"``."""

    def __init__(self, who: str = "") -> None:
        self.who = who
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def drop(self, plane: str, cause: str, detail: str = "") -> None:
        key = f"{plane}/{cause}"
        with self._lock:
            n = self._counts.get(key, 0) + 1
            self._counts[key] = n
        if n == 1:
            log.warning(
                "%s: dropped a %s-plane message (%s)%s; further drops of this cause are only counted",
                self.who or "dualpath",
                plane,
                cause,
                f": {detail[:300]}" if detail else "",
            )

    def snapshot(self) -> dict[str, int]:
        """``"plane/cause" -> count`` since start."""
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


def merge(*counts: dict[str, int]) -> dict[str, int]:
    """Sum several ``snapshot()`` results."""
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items()))
