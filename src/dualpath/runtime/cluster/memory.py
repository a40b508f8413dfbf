"""An engine's KV memory: the budget (``--kv-cache-memory``), how it is split, what the host has.

``--kv-cache-memory`` is per engine, in bytes (``2147483648``, ``512MiB``, ``2GB``, ``1.5GiB``) or
as a fraction of the memory available when the cluster starts (``0.1``: a number <= 1), like
vLLM's ``--kv-cache-memory-bytes`` and ``--gpu-memory-utilization``; the engines here run on the
CPU, so "available" is ``MemAvailable`` of ``/proc/meminfo``, lowered to the headroom of the
process's memory cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) when that is smaller.
``auto`` (the default) and how a budget is split into the engine's pools (``KVPools``,
``size_pools``) are ``spec/kv_pools.py``'s rule, which the simulated local cluster sizes its engines
by too (``sim/local.py``). Every pool is preallocated and touched at start, so a host without the
memory fails at start, not mid-request.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

from dualpath.core.errors import ConfigError
from dualpath.spec.kv_pools import (
    AUTO_POOL_BYTES,
    AUTO_POOL_TOKENS,
    DE_BUFFER_SHARE,
    MAX_STAGING_TOKENS,
    PE_STAGING_SHARE,
    STAGING_SLOTS,
    KVPools,
    auto_budget_bytes,
    size_pools,
)

# the pool rule lives in spec/kv_pools.py (shared with the simulator); re-exported here
__all__ = [
    "AUTO",
    "AUTO_POOL_BYTES",
    "AUTO_POOL_TOKENS",
    "DE_BUFFER_SHARE",
    "MAX_STAGING_TOKENS",
    "PE_STAGING_SHARE",
    "STAGING_SLOTS",
    "KVPools",
    "available_memory_bytes",
    "check_fits",
    "parse_memory",
    "release_freed_memory",
    "resolve_memory",
    "rss_bytes",
    "size_pools",
]

AUTO = "auto"
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tb": 1e12, "tib": 2**40}  # fmt: skip
_SPEC = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")


def parse_memory(spec: str) -> tuple[int, float]:
    """``(bytes, 0.0)`` for a size, ``(0, fraction)`` for a fraction; ``(0, 0.0)`` for ``auto``."""
    text = str(spec).strip().lower()
    if text == AUTO:
        return 0, 0.0
    m = _SPEC.match(text)
    if m is None or m.group(2) not in _UNITS:
        raise ConfigError(
            "kv_cache_memory", spec, "expected bytes (4294967296, 512MiB, 2GB), a fraction <= 1 of the "
            "available memory (0.2) or 'auto'",
        )  # fmt: skip
    value = float(m.group(1))
    if not m.group(2) and 0 < value <= 1:
        return 0, value
    size = int(value * _UNITS[m.group(2)])
    if size <= 0:
        raise ConfigError("kv_cache_memory", spec, "must be > 0")
    return size, 0.0


def available_memory_bytes() -> int:
    """Memory this process may still take: ``MemAvailable``, or the cgroup's headroom if smaller."""
    avail = _meminfo_available()
    head = _cgroup_headroom()
    return min(avail, head) if head is not None else avail


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _cgroup_headroom() -> int | None:
    """Limit minus usage of this process's memory cgroup (v2, then v1); None without a limit."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        if ctrl == "":  # v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            got = _limit_minus_usage(base / "memory.max", base / "memory.current")
        elif "memory" in ctrl.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            got = _limit_minus_usage(base / "memory.limit_in_bytes", base / "memory.usage_in_bytes")
        else:
            continue
        if got is not None:
            return got
    return None


def _limit_minus_usage(limit: Path, usage: Path) -> int | None:
    try:
        raw = limit.read_text().strip()
        if raw == "max" or int(raw) >= 1 << 60:
            return None
        return max(int(raw) - int(usage.read_text().strip()), 0)
    except (OSError, ValueError):
        return None


def check_fits(spec: str, num_engines: int) -> None:
    """ConfigError when ``num_engines`` budgets of ``spec`` exceed the memory available now: an
    engine would be killed for memory at start. (``auto`` is not checked: at most
    ``AUTO_POOL_BYTES``, much less for a small model, its size is known only once the model is.)"""
    size, fraction = parse_memory(spec)
    if fraction:
        size = int(fraction * available_memory_bytes())
    if not size:
        return
    need, avail = num_engines * size, available_memory_bytes()
    if need > avail:
        raise ConfigError(
            "kv_cache_memory", spec, f"{num_engines} engine(s) x {size / 2**30:.2f} GiB "
            f"exceed the {avail / 2**30:.2f} GiB of memory available",
        )  # fmt: skip


def resolve_memory(spec: str, kv_bytes_per_token: int) -> int:
    """The budget in bytes for one engine whose model's KV takes ``kv_bytes_per_token``."""
    size, fraction = parse_memory(spec)
    if fraction:
        return int(fraction * available_memory_bytes())
    if size:
        return size
    return auto_budget_bytes(kv_bytes_per_token)


def release_freed_memory() -> None:
    """Give the C heap's free pages back to the kernel (glibc ``malloc_trim``): loading a model
    frees its transient copies into the heap, where they would stay resident."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of ``pid`` (``VmRSS``), 0 where /proc is absent."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
