"""``--kv-backend nixl-posix``: the POSIX directory store, block bytes moved by NIXL's POSIX plugin.

This is the path NVIDIA Dynamo's KVBM takes to a file tier: a NIXL agent with the ``POSIX``
backend, the block file registered as a ``FILE`` segment (its fd), the caller's buffer as a
``DRAM`` segment, one WRITE or READ request per block (header and data as two descriptors), posted
and polled to completion. Everything else is ``posix_backend`` unchanged: files are opened and
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


def import_nixl() -> Any:
    """NIXL's ``_api`` module with its POSIX plugin; ConfigError naming what is missing."""
    from dualpath.runtime.transfer.nixl import import_api

    try:
        return import_api()
    except ConfigError as exc:
        raise ConfigError("kv_backend", "nixl-posix", exc.reason) from None


def _addr(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data) if len(buf) else 0


class NixlFileIO(FileIO):
    """``FileIO`` through NIXL's POSIX backend (see the module docstring)."""

    def __init__(self) -> None:
        self._api = import_nixl()
        self._local = threading.local()
        self._agents: list[Any] = []
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
        agent = self.agent()
        mem = [(_addr(b), len(b), 0, "") for b, _ in spans]
        mem_reg = agent.register_memory(mem, "DRAM")
        file_reg = agent.register_memory([(0, max(file_len, 1), fd, "")], "FILE")
        try:
            local = agent.get_xfer_descs([(a, n, 0) for a, n, _, _ in mem], "DRAM")
            remote = agent.get_xfer_descs([(off, len(b), fd) for b, off in spans], "FILE")
            handle = agent.initialize_xfer(op, local, remote, agent.name)
            try:
                _wait(agent, handle, op, fd)
            finally:
                agent.release_xfer_handle(handle)
        finally:
            agent.deregister_memory(file_reg)
            agent.deregister_memory(mem_reg)

    def close(self) -> None:
        with self._lock:
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
            time.sleep(0)  # yield the GIL, no timer: the request is usually done within this
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
