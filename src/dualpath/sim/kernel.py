"""Deterministic discrete-event kernel.

Events live in one heap keyed ``(time_s, priority, seq)``: equal times run in priority order, then
in scheduling order (``seq`` is a per-kernel counter, never global). The heap holds
``(time_s, priority << 40 | seq, item)``: the same order (``seq`` stays below 2**40) at one integer
comparison instead of two when times tie. Callbacks are plain callables
taking no argument (bind with a closure or a bound method). Cancellation is lazy: ``at``
returns a handle whose ``cancel()`` marks it dead; the heap skips dead entries (``call_at`` is the
same without a handle, for events nobody cancels). An exception in a
callback propagates out of :meth:`Kernel.run` with the simulated time attached, so a failed event
fails the whole run loudly. Nothing here reads a clock or draws random numbers.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Final, cast

from dualpath.core.errors import DualpathError

# Priorities for events at the same instant: completions before new work, so freed resources are
# visible when the scheduler fetches at the same time.
PRIO_COMPLETE: Final = 0
PRIO_ENGINE: Final = 1
PRIO_FETCH: Final = 2
PRIO_ARRIVAL: Final = 3
_SEQ_BITS: Final = 40  # the heap key's low bits hold seq, the high ones the priority


class SimulationError(DualpathError):
    """An event failed or an invariant broke; ``time_s`` is the simulated time of the failure."""

    def __init__(self, time_s: float, message: str) -> None:
        self.time_s = time_s
        super().__init__(f"t={time_s:.6f}s: {message}")


class Handle:
    """A scheduled event; ``cancel()`` stops it from running (no-op once it ran)."""

    __slots__ = ("fn", "alive")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.alive = True

    def cancel(self) -> None:
        self.alive = False


class Kernel:
    """The event loop. ``now_s`` only moves forward; ``events`` counts callbacks that ran
    (updated when :meth:`run` returns)."""

    __slots__ = ("now_s", "events", "_heap", "_seq", "_stopped")

    def __init__(self) -> None:
        self.now_s = 0.0
        self.events = 0
        # last: a Handle or a plain callable
        self._heap: list[tuple[float, int, object]] = []
        self._seq = 0
        self._stopped = False

    def at(self, time_s: float, fn: Callable[[], None], priority: int = PRIO_ENGINE) -> Handle:
        """Run ``fn`` at absolute ``time_s`` (not before now). Returns a cancellable handle."""
        handle = Handle(fn)
        self._push(time_s, handle, priority)  # run() unwraps it
        return handle

    def call_at(self, time_s: float, fn: Callable[[], None], priority: int = PRIO_ENGINE) -> None:
        """Like :meth:`at` without a handle (cannot be cancelled): the hot paths' cheaper form.
        Both share one heap and one ``seq`` counter, so the event order is the same either way."""
        self._push(time_s, fn, priority)

    def _push(self, time_s: float, item: object, priority: int) -> None:
        if time_s < self.now_s:
            if time_s < self.now_s - 1e-9:
                raise SimulationError(self.now_s, f"event scheduled in the past ({time_s!r})")
            time_s = self.now_s
        self._seq += 1
        heapq.heappush(self._heap, (time_s, (priority << _SEQ_BITS) + self._seq, item))

    def stop(self) -> None:
        """Stop the loop after the current event (the online stopping rule uses this)."""
        self._stopped = True

    def run(self, until_s: float = float("inf")) -> float:
        """Run events in key order until the heap is empty, ``until_s`` passes, or ``stop()``."""
        heap = self._heap
        pop = heapq.heappop
        self._stopped = False
        events = self.events
        try:
            while heap and not self._stopped:
                entry = heap[0]
                time_s = entry[0]
                if time_s > until_s:
                    break
                pop(heap)
                item = entry[2]
                if isinstance(item, Handle):
                    if not item.alive:
                        continue
                    item.alive = False
                    fn = item.fn
                else:
                    fn = cast("Callable[[], None]", item)
                self.now_s = time_s
                events += 1  # stored in self.events when the loop ends
                try:
                    fn()
                except SimulationError:
                    raise
                except Exception as exc:  # a failed event fails the run, with context
                    raise SimulationError(time_s, f"event {fn!r} failed: {exc!r}") from exc
        finally:
            self.events = events
        return self.now_s

    @property
    def pending(self) -> int:
        return sum(1 for entry in self._heap if not isinstance(entry[2], Handle) or entry[2].alive)
