"""``--kv-backend mooncake``: Full Blocks as objects in Mooncake Store (a distributed memory pool).

Each block is one object holding exactly the bytes a block file holds (``blockfile.py``: header
with one crc32 per Layer Block, then the layers), under ``<namespace>/<L>x<B>x<K>/<hash>`` (the
layout in the key, so models of different layouts share one master without meeting). What holds:

- atomic visibility: Mooncake's put is two-phase (PutStart allocates, PutEnd publishes); an object
  is readable only after PutEnd, and a put that dies midway is released by the master
  (``put_start_release_timeout_sec``). A read that races a removal gets OBJECT_NOT_FOUND: a miss.
- checksums: the header and every Layer Block read are checked here exactly as from a file; a
  Layer Block read fetches only its byte range and the header (``get_into_ranges``).
- quarantine: a corrupt object is copied to ``.../quarantine/<hash>.<pid>.<ns>`` and removed;
  this process keeps its newest ``KEEP_ENTRIES`` and removes older ones. Unlike a rename, the
  removal cannot check that the object is still the one read: a good copy another process put in
  between is removed too (a miss, written again later; bad bytes are never served).
- prefix index: the store's trie as on every backend; Mooncake has no key listing, so a store
  opens empty and finds other writers' blocks by lookup (``is_exist`` + header) as it does for
  blocks another process wrote after its directory scan.

Capacity is the master's: objects live in the global segments its clients mount (``dualpath
serve --kv-backend mooncake`` starts one holder, ``mooncake_service.py``), and the master evicts
at its high watermark (a vanished block is a miss); ``free_bytes`` is unknown (None). Engines
mount no segment of their own (``global_segment_size`` 0), so they may come and go. Transfers use
a per-thread staging buffer registered once with the client (``protocol`` ``tcp`` here; ``rdma``
on a fabric). Package ``mooncake-transfer-engine-non-cuda`` 0.3.13.post1 (Debian's libibverbs1).
"""

from __future__ import annotations

import errno
import mmap
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from dualpath.core.errors import ConfigError
from dualpath.runtime.kvstore.backend import BlockBackend
from dualpath.runtime.kvstore.blockfile import (
    BlockHeader,
    CorruptBlockError,
    crc_layers,
    decode_header,
    encode_header,
    file_bytes_for,
    header_bytes_for,
    verify_layers,
)
from dualpath.runtime.kvstore.layout import BlockLayout
from dualpath.runtime.kvstore.quarantine import KEEP_ENTRIES

INSTALL = "pip install 'dualpath[mooncake]' (mooncake-transfer-engine-non-cuda; needs Debian's libibverbs1)"
# Mooncake's ErrorCode (mooncake-store/include/types.h; Python gets the ints)
NO_SPACE = -200  # NO_AVAILABLE_HANDLE: no segment has room (after the master evicted)
NOT_FOUND = -704  # OBJECT_NOT_FOUND
CONNECT_TIMEOUT_S = 5.0  # to find the master's RPC port listening, before Mooncake's own setup
# A read answered with any negative code is a miss, never corruption: -703 REPLICA_IS_NOT_READY
# (a put in progress: not yet visible), -704, -707 LEASE_EXPIRED (the read outlived its lease, the
# bytes may be gone), -800 TRANSFER_FAIL, -900 RPC_FAIL. Nothing is quarantined for them.


@dataclass(frozen=True, slots=True, kw_only=True)
class MooncakeSpec:
    """Where the store is: ``master`` (host:port of mooncake_master's RPC), ``metadata`` (its
    HTTP metadata server, ``http://host:port/metadata``), ``protocol`` (tcp or rdma), ``host``
    (this client's address as the master's other clients reach it), ``namespace`` (the keys'
    first part: clusters sharing a master keep apart by it)."""

    master: str
    metadata: str
    protocol: str = "tcp"
    host: str = "127.0.0.1"
    namespace: str = "dualpath"


def import_store() -> Any:
    """``mooncake.store``; ConfigError naming what is missing otherwise."""
    try:
        import mooncake.store as store
    except ImportError as exc:
        raise ConfigError(
            "kv_backend", "mooncake", f"cannot import mooncake.store ({exc}); {INSTALL}"
        ) from None
    return store


class MooncakeBackend(BlockBackend):
    """Blocks in the Mooncake Store at ``spec`` (see the module docstring)."""

    name = "mooncake"

    def __init__(self, layout: BlockLayout, spec: MooncakeSpec) -> None:
        self.layout = layout
        self.spec = spec
        self.where = f"mooncake://{spec.master}"
        shape = f"{layout.num_layers}x{layout.block_size}x{layout.kv_bytes_per_token_layer}"
        self.prefix = f"{spec.namespace}/{shape}/"
        self.nbytes = file_bytes_for(layout)
        self.hbytes = header_bytes_for(layout)
        _reachable(spec.master)
        self._client = import_store().MooncakeDistributedStore()
        rc = self._client.setup(spec.host, spec.metadata, 0, 0, spec.protocol, "", spec.master)
        if rc != 0:
            raise ConfigError("kv_backend", "mooncake", f"setup against master {spec.master} failed ({rc})")
        self._local = threading.local()
        self._bufs: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._quarantined: deque[str] = deque()

    def key(self, block_hash: str) -> str:
        return self.prefix + block_hash

    def _staging(self) -> memoryview:
        """This thread's registered buffer of one block object."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = mmap.mmap(-1, self.nbytes)
            if self._client.register_buffer(_addr(memoryview(buf)), self.nbytes) != 0:
                raise OSError(errno.EIO, f"mooncake: registering a {self.nbytes}-byte buffer failed")
            self._local.buf = buf
            with self._lock:
                self._bufs.append(buf)
        return memoryview(buf)

    def write(self, block_hash: str, parent: str | None, token_ids: np.ndarray, data: memoryview) -> None:
        stage = self._staging()
        stage[: self.hbytes] = encode_header(
            self.layout, block_hash, parent, token_ids, crc_layers(data, self.layout)
        )
        stage[self.hbytes :] = data
        rc = self._client.put_from(self.key(block_hash), _addr(stage), self.nbytes)
        if rc != 0:
            code = errno.ENOSPC if rc == NO_SPACE else errno.EIO
            raise OSError(code, f"mooncake put_from {block_hash}: error {rc}")

    def read(self, block_hash: str, out: memoryview, layer: int | None, verify: bool) -> BlockHeader | None:
        stage = self._staging()
        first = 0 if layer is None else layer
        start = self.hbytes + (0 if layer is None else self.layout.layer_range(layer)[0])
        if layer is None:  # the whole object: one get (faster than two ranges)
            n = self._client.get_into(self.key(block_hash), _addr(stage), self.nbytes)
            got = None if n < 0 else [min(n, self.hbytes), n - self.hbytes]
        else:
            got = self._get(block_hash, stage, [(0, self.hbytes), (start, len(out))])
        try:
            if got is None:  # a range past a short object's end fails too: tell it from a miss
                size = self._client.get_size(self.key(block_hash))
                if size < 0 or size == self.nbytes:
                    return None
                raise CorruptBlockError(block_hash, f"size {size} != {self.nbytes}")
            if got[0] != self.hbytes or got[1] != len(out):
                raise CorruptBlockError(block_hash, f"truncated: {got[1]} of {len(out)} data bytes")
            header = decode_header(stage[: self.hbytes], self.layout, block_hash)
            data = stage[self.hbytes : self.hbytes + len(out)]
            if verify:
                verify_layers(header, data, self.layout, first)
        except CorruptBlockError:
            self._quarantine(block_hash)
            raise
        out[:] = data
        return header

    def _get(self, block_hash: str, stage: memoryview, ranges: list[tuple[int, int]]) -> list[int] | None:
        """Fetch byte ranges of the object back to back into ``stage``: the bytes got per range;
        None if the store answered an error (absent, not ready, lease expired: a miss)."""
        dst, at = [], 0
        for _, n in ranges:
            dst.append(at)
            at += n
        res = self._client.get_into_ranges(
            [_addr(stage)],
            [[self.key(block_hash)]],
            [[dst]],
            [[[s for s, _ in ranges]]],
            [[[n for _, n in ranges]]],
        )[0][0]
        return None if any(r < 0 for r in res) else list(res)

    def read_header(self, block_hash: str) -> BlockHeader | None:
        size = self._client.get_size(self.key(block_hash))
        if size < 0:
            return None
        stage = self._staging()
        try:
            if size != self.nbytes:
                raise CorruptBlockError(block_hash, f"size {size} != {self.nbytes}")
            got = self._get(block_hash, stage, [(0, self.hbytes)])
            if got is None:
                return None
            if got[0] != self.hbytes:
                raise CorruptBlockError(block_hash, f"header truncated ({got[0]} < {self.hbytes} bytes)")
            return decode_header(stage[: self.hbytes], self.layout, block_hash)
        except CorruptBlockError:
            self._quarantine(block_hash)
            raise

    def _quarantine(self, block_hash: str) -> None:
        """Copy the object aside (bounded, newest kept) and remove it (see the module docstring)."""
        stage = self._staging()
        size = self._client.get_size(self.key(block_hash))
        if (
            0 < size <= self.nbytes
            and self._client.get_into(self.key(block_hash), _addr(stage), size) == size
        ):
            aside = f"{self.prefix}quarantine/{block_hash}.{os.getpid()}.{time.time_ns()}"
            if self._client.put_from(aside, _addr(stage), size) == 0:
                with self._lock:
                    self._quarantined.append(aside)
                    old = [self._quarantined.popleft() for _ in range(len(self._quarantined) - KEEP_ENTRIES)]
                for k in old:
                    self._client.remove(k, True)
        self._client.remove(self.key(block_hash), True)

    def quarantined(self) -> list[str]:
        """Keys this process moved aside, oldest first."""
        with self._lock:
            return list(self._quarantined)

    def exists(self, block_hash: str) -> bool:
        return self._client.is_exist(self.key(block_hash)) == 1

    def scan(self, stale_tmp_s: float) -> Iterator[str]:
        return iter(())  # no key listing: blocks are found by lookup (module docstring)

    def remove(self, block_hash: str) -> bool:
        return self._client.remove(self.key(block_hash), True) == 0

    def free_bytes(self) -> int | None:
        return None

    def raw(self, block_hash: str) -> bytes | None:
        """The object's bytes as stored, unchecked (for tools and tests)."""
        stage = self._staging()
        got = self._client.get_into(self.key(block_hash), _addr(stage), self.nbytes)
        return None if got < 0 else bytes(stage[:got])

    def put_raw(self, block_hash: str, payload: bytes) -> None:
        """Replace the object with ``payload``, unchecked (for tools and tests: a corrupt copy)."""
        stage = self._staging()
        self._client.remove(self.key(block_hash), True)
        stage[: len(payload)] = payload
        rc = self._client.put_from(self.key(block_hash), _addr(stage), len(payload))
        if rc != 0:
            raise OSError(errno.EIO, f"mooncake put_from {block_hash}: error {rc}")

    def close(self) -> None:
        with self._lock:
            bufs, self._bufs = self._bufs, []
        for buf in bufs:
            self._client.unregister_buffer(_addr(memoryview(buf)))
        self._client.close()


def _reachable(master: str) -> None:
    """ConfigError at once when nothing listens at ``master`` (Mooncake's setup would retry ~90 s)."""
    host, _, port = master.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError("kv_mooncake_master", master, "must be HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(
            "kv_mooncake_master", master, f"no Mooncake master reachable there ({exc})"
        ) from None


def _addr(buf: memoryview) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)
