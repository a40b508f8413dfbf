"""``--kv-backend nixl-posix``: the POSIX directory store, block bytes moved by NIXL's POSIX plugin.

This is the path NVIDIA Dynamo's KVBM takes to a file tier: a NIXL agent with the ``POSIX``
backend, the block file registered as a ``FILE`` segment (its fd), the caller's buffer as a
``DRAM`` segment, one WRITE or READ request per block (header and data as two descriptors), posted
and polled to completion. Registrations are cached per agent (``Registrations``): a pooled read
buffer is registered once, a file again only when its fd names another file. Everything else is ``posix_backend`` unchanged: files are opened and
renamed by this process through directory fds with O_NOFOLLOW, a write goes to a private temp
file that is renamed over the final name only once NIXL reports it DONE (atomic visibility), the
header and crc32 checks run on the bytes NIXL read, and a corrupt file is quarantined as before.

One agent per thread (the IOEngine's workers read concurrently; an agent's POSIX backend runs a
request to completion on its caller's thread). NIXL never reads past the end of a file here: a
read is clamped to the file's size first, so a truncated file reads short, as with ``preadv``.
Package ``nixl-cu12`` 1.5.1 (its wheel bundles the POSIX plugin, ``libplugin_POSIX.so``).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from dualpath.core.errors import ConfigError
from dualpath.runtime.kvstore.fileio import FileIO
from dualpath.runtime.kvstore.layout import BlockLayout
from dualpath.runtime.kvstore.posix_backend import PosixBackend

POLL_SPIN_S = 2e-3  # polls only yield the GIL this long (a 1.4 MiB block reads in ~0.1-1 ms)
POLL_MAX_S = 0.5e-3  # then back off from 10 us to this between polls (as transfer/nixl.py)
TIMEOUT_S = 30.0  # one block's request (as the store's other waits on a slow disk)
MAX_REGS = 64  # cached registrations per agent and kind (the store's read buffers are pooled, fewer)


def import_nixl() -> Any:
    """NIXL's ``_api`` module with its POSIX plugin; ConfigError naming what is missing."""
    from dualpath.runtime.transfer.nixl import import_api

    try:
        return import_api()
    except ConfigError as exc:
        raise ConfigError("kv_backend", "nixl-posix", exc.reason) from None


def _addr(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if len(buf) else 0


class Registrations:
    """One agent's cached registrations: buffers by (address, bytes), files by what the fd is.

    A buffer (the store's pooled read buffers come back at the same addresses) is registered once
    and kept, up to ``MAX_REGS`` (least recently used deregistered first). A file is kept by
    (fd, device, inode, size): the same block file read again through a reopened fd of the same
    number hits; an fd number now naming another file misses, and its stale registration is
    dropped first (the fd of a registration is only a number to NIXL's POSIX plugin: it neither
    dups nor closes it, so a cached entry never outlives its meaning)."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent
        self._mem: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._files: OrderedDict[tuple[int, int, int, int], Any] = OrderedDict()
        self.hits = self.misses = 0

    def memory(self, addr: int, nbytes: int) -> None:
        self._keep(self._mem, (addr, nbytes), lambda: [(addr, nbytes, 0, "")], "DRAM")

    def file(self, fd: int, nbytes: int) -> None:
        st = os.fstat(fd)
        key = (fd, st.st_dev, st.st_ino, nbytes)
        if key not in self._files:
            for old in [k for k in self._files if k[0] == fd]:
                self._agent.deregister_memory(self._files.pop(old))
        self._keep(self._files, key, lambda: [(0, nbytes, fd, "")], "FILE")

    def clear(self) -> None:
        for cache in (self._files, self._mem):
            while cache:
                self._agent.deregister_memory(cache.popitem()[1])

    def _keep(self, cache: OrderedDict[Any, Any], key: Any, descs: Any, kind: str) -> None:
        if key in cache:
            self.hits += 1
            cache.move_to_end(key)
            return
        self.misses += 1
        cache[key] = self._agent.register_memory(descs(), kind)
        while len(cache) > MAX_REGS:
            self._agent.deregister_memory(cache.popitem(last=False)[1])


class NixlFileIO(FileIO):
    """``FileIO`` through NIXL's POSIX backend (see the module docstring)."""

    def __init__(self) -> None:
        self._api = import_nixl()
        self._local = threading.local()
        self._agents: list[Any] = []
        self._regs: list[Registrations] = []
        self._lock = threading.Lock()
        self.agent()  # fail at open, not at the first write, when the plugin is missing

    def agent(self) -> Any:
        """This thread's agent (made on first use, with the POSIX backend)."""
        agent = getattr(self._local, "agent", None)
        if agent is None:
            name = f"dualpath-kv-{uuid.uuid4().hex[:12]}"
            agent = self._api.nixl_agent(name, self._api.nixl_agent_config(backends=[]))
            if "POSIX" not in agent.get_plugin_list():
                raise ConfigError("kv_backend", "nixl-posix", "this NIXL build has no POSIX plugin")
            agent.create_backend("POSIX", {})
            self._local.agent = agent
            self._local.regs = Registrations(agent)
            with self._lock:
                self._regs.append(self._local.regs)
            with self._lock:
                self._agents.append(agent)
        return agent

    def writev(self, fd: int, parts: list[memoryview]) -> None:
        offset, spans = 0, []
        for p in parts:
            spans.append((p, offset))
            offset += len(p)
        self._xfer("WRITE", fd, spans, offset)

    def readv(self, fd: int, bufs: list[memoryview], offset: int) -> int:
        spans, at = [], offset
        for b in bufs:
            spans.append((b, at))
            at += len(b)
        return sum(self.read_spans(fd, spans))

    def read_spans(self, fd: int, spans: list[tuple[memoryview, int]]) -> list[int]:
        """One READ request for every span, each clamped to the file's end (short reads, as preadv)."""
        size = os.fstat(fd).st_size
        clamped = [(b[: max(0, min(len(b), size - off))], off) for b, off in spans]
        self._xfer("READ", fd, [(b, off) for b, off in clamped if len(b)], size)
        return [len(b) for b, _ in clamped]

    def _xfer(self, op: str, fd: int, spans: list[tuple[memoryview, int]], file_len: int) -> None:
        """One request moving ``spans`` (buffer, file offset) between memory and ``fd``."""
        if not spans:
            return
        agent, regs = self.agent(), self._local.regs
        mem = [(_addr(b), len(b)) for b, _ in spans]
        for a, n in mem:
            regs.memory(a, n)
        regs.file(fd, max(file_len, 1))
        local = agent.get_xfer_descs([(a, n, 0) for a, n in mem], "DRAM")
        remote = agent.get_xfer_descs([(off, len(b), fd) for b, off in spans], "FILE")
        handle = agent.initialize_xfer(op, local, remote, agent.name)
        try:
            _wait(agent, handle, op, fd)
        finally:
            agent.release_xfer_handle(handle)

    def close(self) -> None:
        with self._lock:
            for regs in self._regs:
                regs.clear()
            self._regs.clear()
            self._agents.clear()  # the agents go with their last reference


def _wait(agent: Any, handle: Any, op: str, fd: int) -> None:
    state = agent.transfer(handle)
    start = time.monotonic()
    pause = 10e-6
    while state in ("PROC", "PENDING"):
        waited = time.monotonic() - start
        if waited > TIMEOUT_S:
            raise TimeoutError(f"NIXL POSIX {op} on fd {fd} not done after {TIMEOUT_S:.0f} s")
        if waited < POLL_SPIN_S:
            os.sched_yield()  # yield the GIL and the CPU, no timer (sleep(0) costs a timer slack)
        else:
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        raise OSError(f"NIXL POSIX {op} on fd {fd} ended {state}")


class NixlPosixBackend(PosixBackend):
    """The POSIX directory store (``posix_backend``) with NIXL moving the bytes."""

    name = "nixl-posix"

    def __init__(
        self,
        root: str | Path,
        layout: BlockLayout,
        *,
        file_mode: int = 0o600,
        fsync: bool = False,
        direct_io: bool = False,
    ) -> None:
        self.nixl = NixlFileIO()
        super().__init__(root, layout, file_mode=file_mode, fsync=fsync, direct_io=direct_io, io=self.nixl)

    def close(self) -> None:
        super().close()
        self.nixl.close()
