"""Shared-memory transport between processes of one host.

Same protocol and guarantees as :class:`ZmqTransport` (its subclass), but payload bytes travel through
a ring in shared memory (a file under /dev/shm, one ring per sender->receiver pair, created and
unlinked by the sender); the ZeroMQ message carries only offsets. The sender copies a batch into the
ring once, the receiver's sink reads it in place (``deliver`` must copy/consume, as the contract says),
and the ack frees the range. A batch larger than the ring falls back to ordinary frames.
"""

from __future__ import annotations

import mmap
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq

from dualpath.core.errors import require
from dualpath.runtime.transfer.base import TransferItem
from dualpath.runtime.transfer.ring import RingAllocator
from dualpath.runtime.transfer.zmq_transport import ZmqTransport
from dualpath.runtime.transfer.zmq_wire import DataMsg, ItemMeta, payload_view


def _shm_dir() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


class _Ring(RingAllocator):
    """A ``RingAllocator`` over a file in the shm directory (``buf``: its mapping)."""

    def __init__(self, capacity_bytes: int) -> None:
        super().__init__(capacity_bytes)
        self.path = _shm_dir() / f"dualpath-shm-{uuid.uuid4().hex[:16]}"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, capacity_bytes)
            self.buf = mmap.mmap(fd, capacity_bytes)
        finally:
            os.close(fd)

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:
            pass
        try:
            os.unlink(self.path)
        except OSError:
            pass


class ShmTransport(ZmqTransport):
    """Payloads through shared memory; notifications over ipc:// ZeroMQ (one host only)."""

    kind = "shm"

    def __init__(
        self,
        *,
        ring_bytes: int = 64 * 1024 * 1024,
        limiter: Callable[[int], object] | None = None,
        keys: Any = None,
    ) -> None:
        require(ring_bytes >= 4096, "ring_bytes", ring_bytes, "must be >= 4096")
        self.ring_bytes = ring_bytes
        self._rings: dict[str, _Ring] = {}
        self._maps: dict[str, mmap.mmap] = {}
        super().__init__(scheme="ipc", limiter=limiter, keys=keys)

    def _pack(
        self, dest_addr: str, items: Sequence[TransferItem], resources: list[Any]
    ) -> tuple[list[ItemMeta], list[memoryview], str]:
        views = [payload_view(it.payload) for it in items]
        total = sum(v.nbytes for v in views)
        if total == 0 or total > self.ring_bytes:
            return super()._pack(dest_addr, items, resources)
        ring = self._rings.get(dest_addr)
        if ring is None:
            ring = self._rings[dest_addr] = _Ring(self.ring_bytes)
        start = ring.alloc(total)
        resources.append((ring, start))
        metas, off = [], start
        for it, v in zip(items, views):
            ring.buf[off : off + v.nbytes] = v
            metas.append(
                ItemMeta(it.key, it.block_index, it.layer, it.num_tokens, it.token_offset, v.nbytes, off)
            )
            off += v.nbytes
        return metas, [], str(ring.path)

    def _release(self, resources: list[Any]) -> None:
        for ring, start in resources:
            ring.free(start)

    def _check_frames(self, msg: DataMsg, frames: list[zmq.Frame]) -> str | None:
        """A ring message names one of our senders' rings (a dualpath file in the shm directory)
        and slots inside it; nothing else is opened."""
        if not msg.segment:
            return super()._check_frames(msg, frames)
        path = Path(msg.segment)
        if path.parent != _shm_dir() or not re.fullmatch(r"dualpath-shm-[0-9a-f]{16}", path.name):
            return f"segment {msg.segment!r} is not a dualpath shared-memory ring"
        if len(frames) != 1:
            return f"a ring message carries {len(frames) - 1} payload frames"
        try:
            size = len(self._maps[msg.segment]) if msg.segment in self._maps else path.stat().st_size
        except OSError as exc:
            return f"segment {msg.segment!r}: {exc.strerror}"
        for i, m in enumerate(msg.items):
            if m.slot < 0 or m.slot + m.nbytes > size:
                return f"item {i} slot {m.slot} + {m.nbytes} bytes is outside the {size}-byte ring"
        return None

    def _unpack(self, msg: DataMsg, frames: list[zmq.Frame]) -> list[TransferItem]:
        if not msg.segment:
            return super()._unpack(msg, frames)
        buf = self._maps.get(msg.segment)
        if buf is None:
            fd = os.open(msg.segment, os.O_RDWR)
            try:
                buf = self._maps[msg.segment] = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
        view = memoryview(buf)
        return [
            TransferItem(
                key=m.key,
                block_index=m.block_index,
                layer=m.layer,
                num_tokens=m.num_tokens,
                token_offset=m.token_offset,
                payload=view[m.slot : m.slot + m.nbytes],
            )
            for m in msg.items
        ]

    def close(self) -> None:
        super().close()
        for ring in self._rings.values():
            ring.close()
        for buf in self._maps.values():
            try:
                buf.close()
            except BufferError:
                pass
        self._rings.clear()
        self._maps.clear()
