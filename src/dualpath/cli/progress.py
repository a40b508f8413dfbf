"""Progress for long CLI runs: a rich bar on a terminal, plain timestamped lines in a log.

Progress goes to stderr (stdout keeps tables and ``--json``). When stderr is a terminal the user
sees rich's live bar; when it is not (``dualpath demo > run.log 2>&1``, CI, ``nohup``) the bar would
print nothing for minutes, so :class:`Progress` writes one plain line instead whenever the task
starts, its description changes, it advances (at most every ``interval_s``), every ``interval_s``
while nothing happens, and when it ends::

    [3/12] online dualpath aps=0.25 ... 35 s elapsed

Use::

    from dualpath.cli.progress import Progress

    with Progress("simulating", total=len(systems)) as bar:
        for name in systems:
            bar.update(f"simulating {name}")
            ...
            bar.advance()

``total=None`` is a task without a count (a spinner; lines without ``[k/n]``). The interval comes
from ``DUALPATH_PROGRESS_S`` (default 5 s; 0 = a line at every advance).
"""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

DEFAULT_INTERVAL_S = 5.0


def _interval_from_env() -> float:
    raw = os.environ.get("DUALPATH_PROGRESS_S", "")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S


class Progress:
    """One task's progress (context manager). ``advance``/``update`` may be called from any thread."""

    def __init__(
        self,
        description: str,
        total: int | None = None,
        *,
        console: Console | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.description = description
        self.total = total
        self.completed = 0
        self.console = console if console is not None else Console(stderr=True)
        self.interval_s = _interval_from_env() if interval_s is None else interval_s
        self.plain = not self.console.is_terminal
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._last_line = 0.0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None

    # -- public -------------------------------------------------------------------------------

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        if self.plain:
            self._line()
            if self.interval_s > 0:
                self._ticker = threading.Thread(target=self._tick, name="progress-lines", daemon=True)
                self._ticker.start()
        else:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                ProgressColumn,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )
            from rich.progress import Progress as RichBar

            columns: list[ProgressColumn] = [SpinnerColumn(), TextColumn("{task.description}")]
            if self.total is not None:
                columns += [BarColumn(), MofNCompleteColumn()]
            self._bar = RichBar(*columns, TimeElapsedColumn(), console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=self.total)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=1.0)
        if self._bar is not None:
            self._bar.stop()
        elif self.plain:
            self._line("done" if exc_type is None else f"stopped ({exc_type.__name__})")

    def advance(self, steps: int = 1, description: str | None = None) -> None:
        """Count ``steps`` more done (and optionally change the description)."""
        with self._lock:
            self.completed += steps
            changed = description is not None and description != self.description
            if description is not None:
                self.description = description
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=steps, description=self.description)
        elif self.plain and (changed or self._due()):
            self._line()

    def update(
        self, description: str | None = None, completed: int | None = None, total: int | None = None
    ) -> None:
        """Set the description, the completed count and/or the total (known only once a run has
        started, e.g. bench's request count); a new description prints a line."""
        with self._lock:
            if total is not None:
                self.total = total
            changed = description is not None and description != self.description
            if description is not None:
                self.description = description
            if completed is not None:
                self.completed = completed
        if self._bar is not None and self._task is not None:
            self._bar.update(
                self._task, description=self.description, completed=self.completed, total=self.total
            )
        elif self.plain and changed:
            self._line()

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def format_line(self, note: str = "") -> str:
        """The plain line for the current state, e.g. ``[3/12] online ... 35 s elapsed``."""
        count = f"[{self.completed}/{self.total}] " if self.total is not None else ""
        tail = f", {note}" if note else ""
        return f"{count}{self.description} ... {self.elapsed_s():.0f} s elapsed{tail}"

    # -- plain mode -----------------------------------------------------------------------------

    def _due(self) -> bool:
        return time.monotonic() - self._last_line >= self.interval_s

    def _line(self, note: str = "") -> None:
        with self._lock:
            self._last_line = time.monotonic()
            text = self.format_line(note)
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _tick(self) -> None:
        while not self._stop.wait(min(self.interval_s, 1.0)):
            if self._due():
                self._line()
