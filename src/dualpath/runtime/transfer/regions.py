"""Registered memory of a one-sided transport (``onesided.py``): the caller's KV buffers, sent from
in place, and the generations of its landing buffer.

``Regions`` holds the buffers a caller registered once (``OneSidedTransport.register``: an engine's
KV pools): a payload lying wholly inside one is read by the peer straight from it, without the copy
into the send ring. The contract already keeps such a payload unchanged until its handle completes
(``Transport.submit``), and the handle completes only after the peer's ack, after its read.

``Landing`` is one generation of the landing buffer: its memory, registered once, and a FIFO
allocator of ranges. A read whose engine cannot say it is over (a timeout NIXL could not cancel, a
Mooncake batch that failed without saying whether its bytes still move) could still land late, so
its range is never freed: the transport retires that generation (still registered, its memory kept)
and lands later reads in a fresh one. Retired generations are released at close, once the engine
is closed (nothing lands after that); at most ``MAX_RETIRED`` are kept, after which reads fail with
an error saying so rather than reuse a range a late read may still write.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dualpath.runtime.transfer.base import TransferError
from dualpath.runtime.transfer.ring import RingAllocator

MAX_RETIRED = 8  # landing generations kept for reads that never settled (8 x 64 MiB at the default)


class UnsettledRead(TransferError):
    """A read failed and its engine cannot say that no more of its bytes will land."""


def buffer_addr(buf: Any) -> tuple[int, int]:
    """(address, bytes) of a contiguous CPU tensor or a buffer-protocol object."""
    if isinstance(buf, torch.Tensor):
        if buf.device.type != "cpu" or not buf.is_contiguous():
            raise TransferError(f"only contiguous CPU tensors register here (got {buf.device}, {buf.shape})")
        return buf.data_ptr(), buf.nbytes
    mv = memoryview(buf).cast("B")
    if not mv.nbytes:
        return 0, 0
    return int(np.frombuffer(mv, dtype=np.uint8).ctypes.data), mv.nbytes


class Regions:
    """Address ranges registered with the engine by the caller, looked up per payload."""

    def __init__(self, register: Callable[[int, int], None]) -> None:
        self._register = register
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._keep: list[Any] = []  # the buffers themselves: registered memory stays alive

    def add(self, buf: Any) -> int:
        addr, n = buffer_addr(buf)
        if n == 0:
            return 0
        if self.inside(addr, n) is not None:
            return 0  # already covered by a registration
        self._register(addr, n)
        i = bisect.bisect(self._starts, addr)
        self._starts.insert(i, addr)
        self._ends.insert(i, addr + n)
        self._keep.append(buf)
        return n

    def inside(self, addr: int, n: int) -> int | None:
        """``addr`` when [addr, addr+n) lies in one registered range, else None."""
        i = bisect.bisect(self._starts, addr) - 1
        if i >= 0 and addr + n <= self._ends[i]:
            return addr
        return None

    def __len__(self) -> int:
        return len(self._starts)


class Landing:
    """One generation of the landing buffer (see the module docstring)."""

    def __init__(self, nbytes: int, gen: int, register: Callable[[int, int], None]) -> None:
        self.gen = gen
        self.buf = torch.zeros(nbytes, dtype=torch.uint8)  # touched now: first-touch faults are slow
        self.mv = memoryview(self.buf.numpy()).cast("B")  # type: ignore[arg-type]
        self.addr = self.buf.data_ptr()
        self.ranges = RingAllocator(nbytes)
        register(self.addr, nbytes)
