"""Whether a child process that died of SIGKILL was taken by the kernel's OOM killer.

The supervisor notes, when it starts a process, the memory cgroup that process is in (cgroup v2
``memory.events``, v1 ``memory.oom_control``: both count ``oom_kill`` since Linux 4.13) and that
count; a SIGKILL exit while the count rose is an OOM kill. Without a readable cgroup counter the
machine's ``/proc/vmstat`` ``oom_kill`` stands in (it counts kills anywhere on the host, so the
report then says "likely").
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def memory_cgroup(pid: int | str = "self") -> Path | None:
    """The file counting OOM kills of ``pid``'s memory cgroup (v2 first), None if unreadable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        if ctrl == "":
            events = CGROUP_ROOT / path.lstrip("/") / "memory.events"
        elif "memory" in ctrl.split(","):
            events = CGROUP_ROOT / "memory" / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        if events.exists():
            return events
    return None


def _count(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


@dataclass(slots=True)
class OomWatch:
    """OOM-kill counters at a process's start (its cgroup's and the machine's)."""

    cgroup: Path | None
    cgroup_kills: int | None
    host_kills: int | None

    @classmethod
    def of(cls, pid: int) -> OomWatch:
        cg = memory_cgroup(pid)
        return cls(cg, _count(cg), _count(Path("/proc/vmstat")))

    def verdict(self, returncode: int | None) -> str:
        """ "" unless a SIGKILL exit coincides with an OOM kill: then how it is known."""
        if returncode != -signal.SIGKILL:
            return ""
        now = _count(self.cgroup)
        if self.cgroup_kills is not None and now is not None:
            return (
                f"killed by the kernel's OOM killer (memory cgroup {self.cgroup.parent})"
                if now > self.cgroup_kills
                else ""
            )  # type: ignore[union-attr]
        host = _count(Path("/proc/vmstat"))
        if self.host_kills is not None and host is not None and host > self.host_kills:
            return "likely killed by the kernel's OOM killer (the host's oom_kill count rose)"
        return ""


def exit_text(returncode: int | None) -> str:
    """``exited with code 3`` / ``killed by SIGKILL``."""
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"
