"""The connector's save writer (``savewrite.py``) against a real block store: what is written,
when it becomes visible, flushing on close, and failures (counted, never published)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from dualpath.integrations.vllm.savewrite import SaveWriter, StagedBlock, StagingPool
from dualpath.runtime.kvstore import BlockLayout, BlockStore, files
from dualpath.runtime.kvstore.files import block_path
from dualpath.runtime.kvstore.layout import chain_hashes

LAYOUT = BlockLayout(num_layers=3, kv_bytes_per_token_layer=8, block_size=4)


def _staged(n: int, seed: int = 0, first_token: int = 0) -> tuple[np.ndarray, list[StagedBlock]]:
    """A layer-major staging buffer of ``n`` random blocks of one chain, and its blocks."""
    rng = np.random.default_rng(seed)
    stage = rng.integers(0, 256, (LAYOUT.num_layers, n, LAYOUT.layer_block_bytes), dtype=np.uint8)
    tokens = list(range(first_token, first_token + n * LAYOUT.block_size))
    hashes = chain_hashes(tokens, LAYOUT.block_size)
    size = LAYOUT.block_size
    blocks = [StagedBlock(h, hashes[c - 1] if c else None, tuple(tokens[c * size : (c + 1) * size]), c)
              for c, h in enumerate(hashes)]  # fmt: skip
    return stage, blocks


def _full(stage: np.ndarray, column: int) -> np.ndarray:
    return np.ascontiguousarray(stage[:, column]).reshape(-1)


class _GatedStore(BlockStore):
    """A store whose writes wait for ``gate`` (and record which thread wrote)."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.threads: list[str] = []

    def write_full(self, *args: object, **kw: object) -> bool:
        self.gate.wait(30)
        self.threads.append(threading.current_thread().name)
        return super().write_full(*args, **kw)  # type: ignore[arg-type]


def test_submitted_blocks_become_visible_only_once_written(tmp_path: Path) -> None:
    store = _GatedStore(tmp_path / "kv", LAYOUT, capacity_bytes=None)
    writer = SaveWriter(store)
    stage, blocks = _staged(3)
    pool_buf = writer.pool.take(stage.nbytes)
    writer.submit(stage, blocks, pool_buf)  # returns at once: the step goes on
    assert writer.pending_bytes == 3 * LAYOUT.full_block_bytes
    assert not writer.wait_for([blocks[0].block_hash], timeout_s=0.05)
    assert not any(store.contains(b.block_hash) for b in blocks)  # nothing visible yet
    assert writer.wait_for(["not-submitted"], timeout_s=0)  # unrelated hashes never wait
    store.gate.set()
    assert writer.wait_for([b.block_hash for b in blocks], timeout_s=30)
    assert writer.flush(timeout_s=30) and writer.pending_bytes == 0
    for b in blocks:
        assert np.array_equal(store.read_full(b.block_hash), _full(stage, b.column))
        assert store.parent_of(b.block_hash) == b.parent_hash
    assert set(store.threads) == {"dualpath-save"}
    assert writer.counters == {"saved_blocks": 3, "written_bytes": 3 * LAYOUT.full_block_bytes,
                               "failed_blocks": 0, "async_blocks": 3}  # fmt: skip
    assert writer.pool.take(stage.nbytes) is pool_buf  # given back once written
    assert writer.close()


def test_write_is_in_the_caller_and_an_existing_block_is_not_rewritten(tmp_path: Path) -> None:
    store = _GatedStore(tmp_path / "kv", LAYOUT, capacity_bytes=None)
    store.gate.set()
    writer = SaveWriter(store)
    stage, blocks = _staged(2)
    writer.write(stage, blocks)  # P/D: visible before the step ends
    assert all(store.contains(b.block_hash) for b in blocks)
    assert store.threads == [threading.current_thread().name] * 2
    writer.write(stage, blocks)
    assert writer.counters["saved_blocks"] == 2 and writer.counters["failed_blocks"] == 0
    writer.close()


def test_close_flushes_what_is_queued_and_later_submits_write_in_the_caller(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "kv", LAYOUT, capacity_bytes=None)
    writer = SaveWriter(store)
    jobs = [_staged(2, seed=s, first_token=100 * s) for s in range(4)]
    for stage, blocks in jobs:
        writer.submit(stage, blocks)
    assert writer.close(timeout_s=60)
    assert all(store.contains(b.block_hash) for _, blocks in jobs for b in blocks)
    late_stage, late = _staged(1, seed=9, first_token=900)
    writer.submit(late_stage, late)
    assert store.contains(late[0].block_hash) and writer.counters["saved_blocks"] == 9
    assert writer.close()  # idempotent


def test_a_failing_write_is_counted_not_published_and_the_writer_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BlockStore(tmp_path / "kv", LAYOUT, capacity_bytes=None)
    stage, blocks = _staged(3)
    io = store.backend.io  # type: ignore[attr-defined]  # the POSIX backend's FileIO
    real, calls = io.writev, []

    def failing(fd: int, parts: list[memoryview]) -> None:  # the second block: an I/O error
        calls.append(fd)  # halfway through its file
        if len(calls) == 2:
            os.write(fd, parts[0][: len(parts[0]) // 2])
            raise OSError(errno.EIO, "Input/output error")
        real(fd, parts)

    monkeypatch.setattr(io, "writev", failing)
    writer = SaveWriter(store)
    writer.submit(stage, blocks)
    assert writer.flush(timeout_s=30)
    assert store.contains(blocks[0].block_hash) and store.contains(blocks[2].block_hash)
    assert (
        not store.contains(blocks[1].block_hash) and not block_path(store.root, blocks[1].block_hash).exists()
    )
    assert writer.counters["failed_blocks"] == 1 and writer.counters["saved_blocks"] == 2
    assert store.stats().write_errors == {"EIO": 1}
    assert not [p for p in store.root.rglob("*") if p.name.startswith(files.TMP_PREFIX)]  # no partial file
    writer.close()


def test_an_unexpected_error_is_counted_and_does_not_stop_the_thread(tmp_path: Path) -> None:
    store = BlockStore(tmp_path / "kv", LAYOUT, capacity_bytes=None)
    writer = SaveWriter(store)
    stage, blocks = _staged(2)
    bad = StagedBlock(blocks[1].block_hash, None, blocks[1].token_ids, 1)  # wrong parent: refused
    writer.submit(stage, [blocks[0], bad])
    writer.submit(*_staged(1, seed=3, first_token=50))
    assert writer.flush(timeout_s=30)
    assert writer.counters["failed_blocks"] == 1 and writer.counters["saved_blocks"] == 2
    assert not store.contains(bad.block_hash)
    writer.close()


def test_submit_waits_while_too_much_is_pending(tmp_path: Path) -> None:
    store = _GatedStore(tmp_path / "kv", LAYOUT, capacity_bytes=None)
    writer = SaveWriter(store, max_pending_bytes=2 * LAYOUT.full_block_bytes)
    writer.submit(*_staged(2, seed=0, first_token=0))
    second = threading.Thread(target=writer.submit, args=_staged(1, seed=1, first_token=50))
    second.start()
    second.join(0.1)
    assert second.is_alive() and writer.pending_bytes == 2 * LAYOUT.full_block_bytes  # waits
    store.gate.set()
    second.join(30)
    assert not second.is_alive() and writer.flush(timeout_s=30)
    assert writer.counters["saved_blocks"] == 3
    writer.close()


def test_staging_pool_reuses_the_smallest_fitting_buffer() -> None:
    pool = StagingPool(keep=2)
    a, b = pool.take(100), pool.take(300)
    pool.give(b)
    pool.give(a)
    assert pool.take(50) is a and pool.take(200) is b and pool.allocated == 2
    pool.give(a)
    pool.give(b)
    pool.give(pool.take(1000))  # a third free one: the smallest (a) is dropped
    assert pool.take(10) is b
