"""KV block store: Full Blocks on a POSIX directory, chain-hash addressing, LRU leaf eviction,
and an I/O engine with bounded queue depth. No torch here: data is raw bytes (numpy uint8).

See docs/kvstore.md.
"""

from __future__ import annotations

from dualpath.runtime.kvstore.bandwidth import BandwidthLimiter, SharedTokenBucket, TokenBucket
from dualpath.runtime.kvstore.blockfile import CorruptBlockError
from dualpath.runtime.kvstore.buffers import BufferLease, BufferPool, BufferPoolExhausted
from dualpath.runtime.kvstore.io_engine import IOEngine
from dualpath.runtime.kvstore.io_types import IOEngineConfig, IOStats, ReadResult
from dualpath.runtime.kvstore.layout import BlockLayout, block_hash, chain_hashes, loadable_hit_blocks
from dualpath.runtime.kvstore.store import BlockStore, StoreStats

__all__ = [
    "BandwidthLimiter",
    "BlockLayout",
    "BlockStore",
    "BufferLease",
    "BufferPool",
    "BufferPoolExhausted",
    "CorruptBlockError",
    "IOEngine",
    "IOEngineConfig",
    "IOStats",
    "ReadResult",
    "SharedTokenBucket",
    "StoreStats",
    "TokenBucket",
    "block_hash",
    "chain_hashes",
    "loadable_hit_blocks",
]
