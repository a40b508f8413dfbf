"""IOEngine: queue accounting, buffer pool, misses, writes, bandwidth caps."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dualpath.core.errors import ConfigError
from dualpath.runtime.kvstore import (
    BlockLayout,
    BlockStore,
    BufferPool,
    BufferPoolExhausted,
    IOEngine,
    IOEngineConfig,
    ReadResult,
    SharedTokenBucket,
    TokenBucket,
    block_hash,
)

from .backends import Opener
from .conftest import LAYOUT as BACKEND_LAYOUT


class GateLimiter:
    """A limiter whose reservations wait for a gate: holds reads in flight deterministically."""

    rate_bytes_per_s = 1.0

    def __init__(self) -> None:
        self.gate = threading.Event()

    def reserve(self, nbytes: int) -> float:
        self.gate.wait(10)
        return 0.0


@pytest.fixture
def store(open_store: Opener) -> BlockStore:
    """This module's ``store`` tests run once per storage backend (skipped where one cannot import)."""
    return open_store(BACKEND_LAYOUT)


def test_read_queue_tokens_counts_queued_and_in_flight(
    store: BlockStore, layout: BlockLayout, make_blocks
) -> None:
    hashes, datas = make_blocks(store, np.arange(40))
    limiter = GateLimiter()
    pool = BufferPool(layout.full_block_bytes, 8)
    with IOEngine(store, IOEngineConfig(queue_depth=2), pool=pool, limiter=limiter) as eng:
        futs = eng.submit_blocks(hashes[:3])
        layer_fut = eng.submit_layer(hashes[3], 1)
        assert eng.read_queue_bytes == 3 * layout.full_block_bytes + layout.layer_block_bytes
        # 3 full blocks of 8 tokens + 1/4 of a block (one of 4 layers), rounded up
        assert eng.read_queue_tokens == 3 * 8 + 2
        assert pool.num_free == 4
        limiter.gate.set()
        for f, d in zip(futs, datas, strict=False):
            r = f.result(timeout=10)
            assert r.ok and np.array_equal(r.data, d)
            r.release()
        r = layer_fut.result(timeout=10)
        assert np.array_equal(r.data, datas[3][slice(*layout.layer_range(1))])
        r.release()
        assert eng.read_queue_tokens == 0 and pool.num_free == 8
        assert eng.stats().num_reads == 4


def test_misses_callbacks_and_caller_buffers(store: BlockStore, layout: BlockLayout, make_blocks) -> None:
    hashes, datas = make_blocks(store, np.arange(16))
    seen: list[ReadResult] = []
    done = threading.Event()
    outs = [np.empty(layout.full_block_bytes, np.uint8) for _ in range(3)]
    pool = BufferPool(layout.full_block_bytes, 1)
    with IOEngine(store, pool=pool) as eng:
        missing = block_hash(hashes[1], np.arange(16, 24))
        futs = eng.submit_blocks(
            [*hashes, missing], outs=outs, callback=lambda r: (seen.append(r), done.set())
        )
        results = [f.result(timeout=10) for f in futs]
        assert [r.ok for r in results] == [True, True, False]
        assert results[2].data is None
        assert results[0].data is outs[0] and np.array_equal(outs[1], datas[1])
        miss = eng.submit_full(missing).result(timeout=10)  # pooled buffer returns on a miss
        assert not miss.ok and pool.num_free == 1
        held = eng.submit_full(hashes[0]).result(timeout=10)
        with pytest.raises(BufferPoolExhausted):
            eng.submit_full(hashes[1], timeout_s=0.01)
        held.release()
        held.release()  # second release is ignored
        assert pool.num_free == 1
        assert eng.stats().num_read_misses == 2
    assert done.is_set() and len(seen) == 3


def test_engine_without_pool_needs_out(store: BlockStore, make_blocks) -> None:
    hashes, _ = make_blocks(store, np.arange(8))
    with IOEngine(store) as eng, pytest.raises(ConfigError, match="BufferPool"):
        eng.submit_full(hashes[0])


def test_writes_through_engine(store: BlockStore, layout: BlockLayout) -> None:
    toks = np.arange(8)
    h = block_hash(None, toks)
    data = np.full(layout.full_block_bytes, 7, np.uint8)
    with IOEngine(store) as eng:
        assert eng.submit_write(h, None, toks, data).result(timeout=10) is True
        assert eng.submit_write(h, None, toks, data).result(timeout=10) is False
        assert eng.stats().num_writes == 1
    assert np.array_equal(store.read_full(h), data)


def test_bandwidth_cap_bounds_throughput(store: BlockStore, layout: BlockLayout, make_blocks) -> None:
    hashes, _ = make_blocks(store, np.arange(40))
    rate = 20 * layout.full_block_bytes  # 20 blocks/s: 5 blocks take >= 0.25 s
    limiter = TokenBucket(rate)
    outs = [np.empty(layout.full_block_bytes, np.uint8) for _ in hashes]
    start = time.monotonic()
    with IOEngine(store, IOEngineConfig(queue_depth=4), limiter=limiter) as eng:
        assert all(f.result(timeout=10).ok for f in eng.submit_blocks(hashes, outs=outs))
    assert time.monotonic() - start >= 0.99 * len(hashes) * layout.full_block_bytes / rate


def test_token_bucket_burst_credit() -> None:
    tb = TokenBucket(1000.0, burst_bytes=500)
    now = time.monotonic()
    first = tb.reserve(500)  # idle link: the burst goes at once
    assert first <= now + 0.01
    assert tb.reserve(1000) == pytest.approx(first + 1.0)
    with pytest.raises(ConfigError):
        TokenBucket(0.0)


def _reserve_many(path: str, n: int, out: mp.Queue, barrier) -> None:  # type: ignore[no-untyped-def]
    tb = SharedTokenBucket(path, 1e6)
    barrier.wait(30)  # both book at the same time: separate links would overlap
    out.put([tb.reserve(1000) for _ in range(n)])


def test_shared_token_bucket_serialises_processes(tmp_path: Path) -> None:
    """Reservations from two processes on one state file never overlap: one link, not two."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(2)
    path = str(tmp_path / "snic")
    procs = [ctx.Process(target=_reserve_many, args=(path, 500, q, barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    finishes = sorted(q.get(timeout=60) + q.get(timeout=60))
    for p in procs:
        p.join(timeout=30)
    gaps = np.diff(finishes)
    assert len(finishes) == 1000
    assert gaps.min() >= 1e-3 * (1 - 1e-6)  # each 1000-byte reservation holds the link 1 ms


def test_queued_reads_are_pinned(tmp_path: Path, layout: BlockLayout, make_blocks) -> None:
    from dualpath.runtime.kvstore.blockfile import file_bytes_for

    store = BlockStore(tmp_path, layout, capacity_bytes=2 * file_bytes_for(layout))
    a, da = make_blocks(store, np.arange(8))
    b, _ = make_blocks(store, np.arange(100, 108), seed=1)
    limiter = GateLimiter()
    with IOEngine(store, limiter=limiter) as eng:
        fut = eng.submit_full(a[0], out=np.empty(layout.full_block_bytes, np.uint8))
        make_blocks(store, np.arange(200, 208), seed=2)  # over capacity: a0 is LRU but queued
        assert store.contains(a[0]) and not store.contains(b[0])
        limiter.gate.set()
        r = fut.result(timeout=10)
        assert r.ok and np.array_equal(r.data, da[0])


def test_submit_after_close_leaves_no_accounting(store: BlockStore, layout: BlockLayout, make_blocks) -> None:
    hashes, _ = make_blocks(store, np.arange(8))
    pool = BufferPool(layout.full_block_bytes, 1)
    eng = IOEngine(store, pool=pool)
    eng.close()
    with pytest.raises(RuntimeError):
        eng.submit_full(hashes[0])
    assert eng.read_queue_tokens == 0 and pool.num_free == 1


def test_submit_blocks_batches_and_bounds(store: BlockStore, layout: BlockLayout, make_blocks) -> None:
    hashes, datas = make_blocks(store, np.arange(80))  # 10 blocks
    pool = BufferPool(layout.full_block_bytes, 10)
    with IOEngine(store, IOEngineConfig(queue_depth=3), pool=pool) as eng:
        results = [f.result(timeout=10) for f in eng.submit_blocks(hashes)]
        assert [r.block_hash for r in results] == hashes
        assert all(np.array_equal(r.data, d) for r, d in zip(results, datas, strict=True))
        assert len({r.lease.slot for r in results if r.lease}) == 10  # distinct buffers
        with pytest.raises(BufferPoolExhausted):  # all on loan: all-or-none acquisition
            eng.submit_blocks(hashes[:2], timeout_s=0.01)
        assert pool.num_free == 0
        for r in results:
            r.release()
        with pytest.raises(ConfigError, match="more blocks than the pool"):
            eng.submit_blocks(hashes + hashes[:1])
        layer = [f.result(timeout=10) for f in eng.submit_blocks(hashes[:4], layer=3)]
        assert all(np.array_equal(r.data, layout.layer_view(d, 3)) for r, d in zip(layer, datas))
        for r in layer:
            r.release()
        assert pool.num_free == 10 and eng.read_queue_tokens == 0


def test_cancelled_queued_read_leaves_no_accounting(
    store: BlockStore, layout: BlockLayout, make_blocks
) -> None:
    """A read cancelled while still queued behind another gives back its queue bytes and buffer."""
    hashes, _ = make_blocks(store, np.arange(16))
    pool = BufferPool(layout.full_block_bytes, 2)
    limiter = GateLimiter()
    with IOEngine(store, IOEngineConfig(queue_depth=1), pool=pool, limiter=limiter) as eng:
        first = eng.submit_full(hashes[0])  # holds the only worker at the gate
        queued = eng.submit_full(hashes[1])
        assert queued.cancel()
        limiter.gate.set()
        first.result(timeout=10).release()
    assert eng.read_queue_tokens == 0 and pool.num_free == 2
