"""How a block file's bytes move between memory and an open file descriptor.

``FileIO`` is the kernel's: ``os.pwritev`` / ``os.preadv`` (``--kv-backend posix``);
``nixl_backend.NixlFileIO`` moves the same byte ranges through NIXL's POSIX plugin. Opening,
naming, renaming and quarantine stay in ``files.py`` for both, so the directory guarantees are
the same whichever moves the bytes.
"""

from __future__ import annotations

import os


class FileIO:
    """Scatter-gather I/O on an open fd (thread-safe: no state)."""

    def writev(self, fd: int, parts: list[memoryview]) -> None:
        """Write ``parts`` back to back from offset 0 (a fresh temp file), all of them."""
        offset = 0
        while parts:
            n = os.pwritev(fd, parts, offset)
            offset += n
            while parts and n >= len(parts[0]):
                n -= len(parts[0])
                parts.pop(0)
            if parts and n:
                parts[0] = parts[0][n:]

    def readv(self, fd: int, bufs: list[memoryview], offset: int) -> int:
        """Fill ``bufs`` from ``offset``; the bytes read (short at end of file)."""
        return os.preadv(fd, bufs, offset)

    def read_spans(self, fd: int, spans: list[tuple[memoryview, int]]) -> list[int]:
        """Fill each buffer from its own file offset; the bytes read into each."""
        return [os.preadv(fd, [buf], offset) for buf, offset in spans]
