"""In-memory trie over block hashes with LRU order and pins. Not thread-safe; BlockStore locks it.

Each node is a Full Block known to this process: its parent hash (None for a root) and its size.
Children are kept by parent hash even while the parent is unknown, so blocks may be added in any
order (directory rebuild, blocks found on the file system). Only leaves (no present child) that are
not pinned may be evicted, oldest use first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class _Node:
    parent: str | None
    nbytes: int
    pins: int = 0


class BlockIndex:
    """Parent -> children map plus least-recently-used order over all known blocks."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._children: dict[str, set[str]] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()  # oldest first
        self.used_bytes = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, block_hash: str) -> bool:
        return block_hash in self._nodes

    def parent_of(self, block_hash: str) -> str | None:
        return self._nodes[block_hash].parent

    def add(self, block_hash: str, parent: str | None, nbytes: int) -> bool:
        """Insert a block as most recently used. Returns False (and only touches) if already known."""
        if block_hash in self._nodes:
            self._lru.move_to_end(block_hash)
            return False
        self._nodes[block_hash] = _Node(parent=parent, nbytes=nbytes)
        if parent is not None:
            self._children.setdefault(parent, set()).add(block_hash)
        self._lru[block_hash] = None
        self.used_bytes += nbytes
        return True

    def remove(self, block_hash: str) -> None:
        """Forget a block (no-op if unknown). Its children, if any, stay (as orphans)."""
        node = self._nodes.pop(block_hash, None)
        if node is None:
            return
        del self._lru[block_hash]
        self.used_bytes -= node.nbytes
        if node.parent is not None:
            siblings = self._children.get(node.parent)
            if siblings is not None:
                siblings.discard(block_hash)
                if not siblings:
                    del self._children[node.parent]

    def touch(self, block_hash: str) -> None:
        """Mark a block as just used (no-op if unknown)."""
        if block_hash in self._nodes:
            self._lru.move_to_end(block_hash)

    def is_leaf(self, block_hash: str) -> bool:
        return not self._children.get(block_hash)

    def pin(self, block_hash: str) -> None:
        """Protect a known block from eviction until unpin (counted)."""
        self._nodes[block_hash].pins += 1

    def unpin(self, block_hash: str) -> None:
        node = self._nodes.get(block_hash)
        if node is not None and node.pins > 0:
            node.pins -= 1

    def pop_victim(self, protect: str | None = None) -> str | None:
        """Remove and return the least recently used unpinned leaf, or None if there is none.

        ``protect`` (e.g. the block just written) is never chosen.
        """
        for h in self._lru:
            if h != protect and self._nodes[h].pins == 0 and self.is_leaf(h):
                self.remove(h)
                return h
        return None

    def hashes(self) -> list[str]:
        """All known hashes, oldest use first."""
        return list(self._lru)
