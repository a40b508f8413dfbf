"""An engine's KV memory: the budget (``--kv-cache-memory``), how it is split, what the host has.

``--kv-cache-memory`` is per engine, in bytes (``2147483648``, ``512MiB``, ``2GB``, ``1.5GiB``) or
as a fraction of the memory available when the cluster starts (``0.1``: a number <= 1), like
vLLM's ``--kv-cache-memory-bytes`` and ``--gpu-memory-utilization``; the engines here run on the
CPU, so "available" is ``MemAvailable`` of ``/proc/meminfo``, lowered to the headroom of the
process's memory cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) when that is smaller.
``auto`` (the default) is the smaller of ``AUTO_POOL_BYTES`` and ``AUTO_POOL_TOKENS`` tokens of the
model's KV: a 1P2D SmolLM2-135M cluster with its standby then fits 6 GB (benchmarks/serve_memory.py),
and a tiny test model takes a few MiB.

The budget covers everything KV an engine allocates (all preallocated and touched at start, so a
host without the memory fails at start, not mid-request): a decode engine's paged cache and its
buffer (prompts whose KV the prefill engine is sending), ``DE_BUFFER_SHARE`` of the budget for the
buffer; a prefill engine's buffer (each prompt's KV while it is prefilled) and its two layer
staging slots (``PE_STAGING_SHARE``, at least one full-context request, at most
``MAX_STAGING_TOKENS`` per slot). ``KVPools`` says what that holds: the longest prompt and context a
request may have; the scheduler refuses longer ones with a clear error.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass
from pathlib import Path

from dualpath.core.errors import ConfigError
from dualpath.core.units import GiB

AUTO = "auto"
AUTO_POOL_BYTES = 1 * GiB  # per engine; with 3 engines + standby SmolLM2 fits 6 GB (docs/server.md)
AUTO_POOL_TOKENS = 65536  # per engine; the earlier decode_hbm_tokens default (caps small models)
DE_BUFFER_SHARE = 0.5  # of a DE's budget: its buffer; the rest is the paged cache
PE_STAGING_SHARE = 1 / 8  # of a PE's budget: its two staging slots (one layer each); the rest: buffer
MAX_STAGING_TOKENS = 65536  # per staging slot (a batch's cached + new tokens of one layer)
STAGING_SLOTS = 2  # the layer being computed and the next one being loaded
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
    return min(AUTO_POOL_BYTES, AUTO_POOL_TOKENS * kv_bytes_per_token)


@dataclass(frozen=True, slots=True, kw_only=True)
class KVPools:
    """What one engine allocates for KV (blocks of ``block_bytes``; staging in tokens per slot)."""

    role: str
    budget_bytes: int
    block_size: int
    block_bytes: int  # a Full Block: every layer of ``block_size`` tokens
    token_layer_bytes: int  # one token of one layer (a staging row)
    cache_blocks: int = 0  # DE paged cache
    buffer_blocks: int = 0  # DE / PE buffer
    staging_tokens: int = 0  # PE, per slot

    @property
    def total_bytes(self) -> int:
        staging = STAGING_SLOTS * self.staging_tokens * self.token_layer_bytes
        return (self.cache_blocks + self.buffer_blocks) * self.block_bytes + staging

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt this engine can hold (buffer; a PE's staging too)."""
        n = self.buffer_blocks * self.block_size
        return min(n, self.staging_tokens) if self.role == "prefill" else n

    @property
    def max_context_tokens(self) -> int:
        """Prompt + generated tokens one request may reach here (a DE's cache; a PE: its prompt)."""
        return self.cache_blocks * self.block_size if self.role == "decode" else self.max_prompt_tokens

    def describe(self) -> str:
        mib = 1 << 20
        parts = (
            [f"paged cache {self.cache_blocks * self.block_bytes / mib:.0f} MiB "
             f"({self.cache_blocks * self.block_size} tokens)"]
            if self.role == "decode"
            else [f"staging {STAGING_SLOTS} x {self.staging_tokens} tokens of one layer "
                  f"({STAGING_SLOTS * self.staging_tokens * self.token_layer_bytes / mib:.0f} MiB)"]
        )  # fmt: skip
        parts.append(f"buffer {self.buffer_blocks * self.block_bytes / mib:.0f} MiB "
                     f"({self.buffer_blocks * self.block_size} tokens)")  # fmt: skip
        return f"KV pool {self.total_bytes / mib:.0f} MiB of a {self.budget_bytes / mib:.0f} MiB budget: " + (
            ", ".join(parts)
        )


def size_pools(
    role: str, budget_bytes: int, *, block_size: int, block_bytes: int, num_layers: int, max_context: int
) -> KVPools:
    """Split ``budget_bytes`` (see module docstring); ConfigError when it holds less than one block
    of each pool."""
    token_layer = block_bytes // (block_size * num_layers)
    if role == "decode":
        buffer = int(budget_bytes * DE_BUFFER_SHARE) // block_bytes
        cache = (budget_bytes - buffer * block_bytes) // block_bytes
        pools = KVPools(role=role, budget_bytes=budget_bytes, block_size=block_size, block_bytes=block_bytes,
                        token_layer_bytes=token_layer, cache_blocks=cache, buffer_blocks=buffer)  # fmt: skip
    else:
        full = -(-max_context // block_size) * block_size
        share = int(budget_bytes * PE_STAGING_SHARE) // (STAGING_SLOTS * token_layer)
        staging = min(max(share, full), MAX_STAGING_TOKENS, budget_bytes // (2 * STAGING_SLOTS * token_layer))
        buffer = (budget_bytes - STAGING_SLOTS * staging * token_layer) // block_bytes
        pools = KVPools(role=role, budget_bytes=budget_bytes, block_size=block_size, block_bytes=block_bytes,
                        token_layer_bytes=token_layer, buffer_blocks=buffer, staging_tokens=staging)  # fmt: skip
    if (
        pools.buffer_blocks < 1
        or (role == "decode" and pools.cache_blocks < 1)
        or pools.max_prompt_tokens < 1
    ):
        raise ConfigError(
            "kv_cache_memory", budget_bytes, f"a {role} engine needs at least {2 * block_bytes} bytes "
            f"(one {block_size}-token block of KV of each pool)",
        )  # fmt: skip
    return pools


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
