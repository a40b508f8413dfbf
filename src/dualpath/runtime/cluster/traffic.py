"""Emulated NICs and the per-engine traffic manager.

A :class:`Link` is one direction of a NIC of ``rate`` bytes/s: the project's one link model
(:mod:`dualpath.core.links`, shared with the simulator: FIFO, a priority "ctl" lane for model/control
traffic ahead of the "kv" lane). Its two clocks live in a 16-byte file (in /dev/shm when it exists)
guarded by ``flock``, so every process that opens the same link name shares them: the engines of
one emulated node share their storage NIC. ``rate`` None = uncapped (count only). Clocks are
``time.monotonic()`` (system-wide on Linux).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from dualpath.core.errors import require
from dualpath.core.links import LANES, SNIC_DIRECTIONS, book
from dualpath.core.units import gbps_to_bytes_per_s

PATHS = ("pe-read", "de-read", "pd-transfer", "persist")
_STATE = struct.Struct("<dd")  # (t_free_all, t_free_ctl)


def links_dir(cluster_id: str) -> Path:
    """Directory holding the shared link clocks of one cluster run."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"dualpath-links-{cluster_id}"


class Link:
    """One emulated NIC (one direction). ``reserve`` books a transfer and returns its end time;
    ``transmit`` also sleeps until then. Thread- and process-safe.

    ``slack_s``: a transfer may start up to this long before ``now`` if the link was idle then.
    Emulated senders are threads that wake late on a loaded machine; without slack those wake-up
    delays would show up as idle link time that a real NIC with a queue would not have."""

    def __init__(
        self, name: str, rate_bytes_per_s: float | None, shared_dir: Path | None = None, slack_s: float = 0.0
    ):
        require(
            rate_bytes_per_s is None or rate_bytes_per_s > 0,
            "rate_bytes_per_s",
            rate_bytes_per_s,
            "must be > 0 or None",
        )
        self.name = name
        self.rate_bytes_per_s = rate_bytes_per_s
        self.slack_s = slack_s
        self.bytes_by_lane: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._local = [0.0, 0.0]
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._shared_dir = shared_dir
        self._changed = threading.Event()  # set (and replaced) when the rate changes
        if rate_bytes_per_s is not None:
            self._open_clock()

    def _open_clock(self) -> None:
        if self._shared_dir is None or self._map is not None:
            return
        self._shared_dir.mkdir(parents=True, exist_ok=True)
        path = self._shared_dir / (self.name.replace("/", "_") + ".clock")
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        with _flock(self._fd):
            if os.fstat(self._fd).st_size < _STATE.size:
                os.ftruncate(self._fd, _STATE.size)
        self._map = mmap.mmap(self._fd, _STATE.size)

    def set_rate(self, rate_bytes_per_s: float | None) -> None:
        """Re-cap the link (None: uncapped). What was booked at the old rate is not kept queued:
        the clocks restart from now, and transfers waiting (``wait_until``) are re-timed at the
        new rate, so removing an absurd cap frees them at once."""
        with self._lock:
            self.rate_bytes_per_s = rate_bytes_per_s
            now = time.monotonic()
            self._local = [now, now]
            if rate_bytes_per_s is not None:
                self._open_clock()
            if self._map is not None and self._fd is not None:
                with _flock(self._fd):
                    _STATE.pack_into(self._map, 0, now, now)
            self._changed.set()
            self._changed = threading.Event()

    def wait_until(self, end_s: float) -> None:
        """Sleep until ``end_s`` (a ``reserve`` result); when the rate changes meanwhile, what is
        left of the wait is scaled to the new rate (nothing left when uncapped)."""
        while True:
            with self._lock:
                changed, rate = self._changed, self.rate_bytes_per_s
            left = end_s - time.monotonic()
            if left <= 0 or not changed.wait(left):
                return
            new = self.rate_bytes_per_s
            left = max(end_s - time.monotonic(), 0.0)
            end_s = time.monotonic() + (0.0 if new is None or rate is None else left * rate / new)

    def reserve(self, nbytes: int, lane: str = "kv", now: float | None = None) -> float:
        """Book ``nbytes`` on ``lane``; return the monotonic time at which the transfer completes."""
        require(lane in LANES, "lane", lane, f"choices: {', '.join(LANES)}")
        t = time.monotonic() if now is None else now
        with self._lock:
            self.bytes_by_lane[lane] += nbytes
            if self.rate_bytes_per_s is None:
                return t
            dur = nbytes / self.rate_bytes_per_s
            t -= self.slack_s  # idle time a late-waking caller may still claim (see class doc)
            if self._map is None:
                return book(self._local, t, dur, lane)
            assert self._fd is not None
            with _flock(self._fd):
                state = list(_STATE.unpack_from(self._map, 0))
                end = book(state, t, dur, lane)
                _STATE.pack_into(self._map, 0, *state)
            return end

    def transmit(self, nbytes: int, lane: str = "kv") -> float:
        """Reserve, then sleep until the transfer would have completed; return seconds waited."""
        t0 = time.monotonic()
        self.wait_until(self.reserve(nbytes, lane, t0))
        return max(time.monotonic() - t0, 0.0)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _flock:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)


class TrafficManager:
    """One per engine: its node's storage NIC (shared with the node's other engines) and its own
    compute NIC. Calls block the calling thread for the emulated transfer time (run them on I/O
    threads). ``read_free`` (Oracle) makes storage reads and PD transfers free but still counted.
    ``snic_directions`` (``dualpath.core.links.SNIC_DIRECTIONS``): "duplex" (default) sends persists
    through the SNIC's other direction, so they neither queue behind nor delay this node's storage
    reads; "shared" books reads and persists on one link (the simulator's default)."""

    def __init__(
        self,
        *,
        engine_id: int,
        node_id: int,
        snic_gbps: float | None,
        cnic_gbps: float | None,
        shared_dir: Path | None,
        read_free: bool = False,
        snic_directions: str = "duplex",
    ) -> None:
        require(
            snic_directions in SNIC_DIRECTIONS,
            "snic_directions",
            snic_directions,
            f"choices: {', '.join(SNIC_DIRECTIONS)}",
        )
        self.engine_id = engine_id
        self.node_id = node_id
        self.read_free = read_free
        rate = lambda g: None if g is None else gbps_to_bytes_per_s(g)
        self.snic = Link(f"node{node_id}/snic", rate(snic_gbps), shared_dir, slack_s=0.02)
        self.snic_tx = (
            self.snic
            if snic_directions == "shared"
            else Link(f"node{node_id}/snic-tx", rate(snic_gbps), shared_dir, slack_s=0.02)
        )
        self.cnic = Link(f"engine{engine_id}/cnic", rate(cnic_gbps), shared_dir, slack_s=0.02)
        self.bytes_by_path: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, path: str, nbytes: int) -> None:
        with self._lock:
            self.bytes_by_path[path] += nbytes

    def storage_read(self, nbytes: int, path: str) -> float:
        """A storage read of ``nbytes`` on this node's SNIC for ``path`` ("pe-read" / "de-read")."""
        self._count(path, nbytes)
        self._count("snic-read", nbytes)
        if self.read_free:
            self.snic.bytes_by_lane["kv"] += nbytes
            return 0.0
        return self.snic.transmit(nbytes, "kv")

    def reserve_read(self, nbytes: int, path: str) -> float:
        """Book a whole storage read now (one request's blocks, FIFO with other readers of this
        node) without sleeping; returns when it completes (monotonic). The caller reads, then
        waits until then (``bandwidth``-style overlap of real and emulated I/O)."""
        self._count(path, nbytes)
        self._count("snic-read", nbytes)
        if self.read_free:
            self.snic.bytes_by_lane["kv"] += nbytes
            return time.monotonic()
        return self.snic.reserve(nbytes, "kv")

    def storage_write(self, nbytes: int) -> float:
        """Persisting ``nbytes`` of KV (a full block) through this node's SNIC."""
        self._count("persist", nbytes)
        return self.snic_tx.transmit(nbytes, "kv")

    def kv_send(self, nbytes: int) -> float:
        """KV between engines (PD transfer) on this engine's CNIC, low lane."""
        self._count("pd-transfer", nbytes)
        if self.read_free:
            self.cnic.bytes_by_lane["kv"] += nbytes
            return 0.0
        return self.cnic.transmit(nbytes, "kv")

    def control(self, nbytes: int) -> float:
        """Model / control traffic on this engine's CNIC, high lane."""
        return self.cnic.transmit(nbytes, "ctl")

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        """(bytes per path, bytes per NIC) counted by this process so far."""
        with self._lock:
            paths = {p: int(self.bytes_by_path.get(p, 0)) for p in PATHS}
            reads = int(self.bytes_by_path.get("snic-read", 0))
        nics = {
            self.snic.name: int(sum(self.snic.bytes_by_lane.values())),
            self.snic.name + ":read": reads,
            self.snic_tx.name: int(sum(self.snic_tx.bytes_by_lane.values())),
            self.cnic.name: int(sum(self.cnic.bytes_by_lane.values())),
        }
        return paths, nics

    def set_snic_gbps(self, snic_gbps: float | None) -> None:
        """Re-cap this node's storage NIC (both directions; None = uncapped)."""
        rate = None if snic_gbps is None else gbps_to_bytes_per_s(snic_gbps)
        self.snic.set_rate(rate)
        if self.snic_tx is not self.snic:
            self.snic_tx.set_rate(rate)

    def wait_read(self, end_s: float) -> None:
        """Wait for a storage read booked with ``reserve_read`` (re-timed if the cap changes)."""
        self.snic.wait_until(end_s)

    def close(self) -> None:
        self.snic.close()
        if self.snic_tx is not self.snic:
            self.snic_tx.close()
        self.cnic.close()
