"""Corruption, crashes mid-write, index rebuild and LRU leaf eviction."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from dualpath.runtime.kvstore import BlockLayout, BlockStore, block_hash
from dualpath.runtime.kvstore.blockfile import file_bytes_for, header_bytes_for
from dualpath.runtime.kvstore.files import QUARANTINE_DIR, block_path


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_layer_is_a_reported_miss(
    store: BlockStore, layout: BlockLayout, make_blocks, caplog: pytest.LogCaptureFixture
) -> None:
    toks = np.arange(24)
    hashes, datas = make_blocks(store, toks)
    path = block_path(store.root, hashes[1])
    hdr = header_bytes_for(layout)
    _flip_byte(path, hdr + layout.layer_range(2)[0] + 5)  # inside layer 2
    # other layers of the same block still verify alone
    got = store.read_layer(hashes[1], 1)
    assert got is not None and np.array_equal(got, datas[1][slice(*layout.layer_range(1))])
    with caplog.at_level(logging.WARNING):
        assert store.read_layer(hashes[1], 2) is None
    assert "layer 2 checksum mismatch" in caplog.text
    assert store.stats().num_corrupt == 1
    assert not path.exists()  # quarantined, not left in place
    assert len(list((store.root / QUARANTINE_DIR).iterdir())) == 1
    assert store.match_prefix(toks) == hashes[:1]  # chain stops at the corrupt block
    assert store.read_full(hashes[2]) is not None  # others untouched


def test_corrupt_full_read_and_header(store: BlockStore, layout: BlockLayout, make_blocks) -> None:
    hashes, _ = make_blocks(store, np.arange(16))
    _flip_byte(block_path(store.root, hashes[0]), file_bytes_for(layout) - 1)
    assert store.read_full(hashes[0]) is None
    _flip_byte(block_path(store.root, hashes[1]), 40)  # header bytes
    assert store.read_full(hashes[1]) is None
    assert store.stats().num_corrupt == 2
    # a fresh copy can be written again afterwards
    data = np.zeros(layout.full_block_bytes, np.uint8)
    assert store.write_full(hashes[0], None, np.arange(8), data)
    assert np.array_equal(store.read_full(hashes[0]), data)


def test_unverified_reads_skip_data_crc(tmp_path: Path, layout: BlockLayout, make_blocks) -> None:
    s = BlockStore(tmp_path, layout, verify=False)
    hashes, _ = make_blocks(s, np.arange(8))
    _flip_byte(block_path(s.root, hashes[0]), header_bytes_for(layout) + 1)
    assert s.read_full(hashes[0]) is not None  # documented: only the header is checked


def test_crash_mid_write_reopens_consistent(tmp_path: Path, layout: BlockLayout, make_blocks) -> None:
    s = BlockStore(tmp_path, layout)
    toks = np.arange(32)
    hashes, datas = make_blocks(s, toks)
    # 1) a leftover temp file of a write that never renamed
    tmp = block_path(s.root, hashes[3]).parent / f".tmp.{hashes[3]}.99999.0"
    tmp.write_bytes(b"partial")
    # 2) a final file truncated (e.g. power loss without fsync)
    p2 = block_path(s.root, hashes[2])
    with open(p2, "r+b") as f:
        f.truncate(file_bytes_for(layout) // 2)
    # 3) a final file cut inside its header
    with open(block_path(s.root, hashes[3]), "r+b") as f:
        f.truncate(100)
    s2 = BlockStore(tmp_path, layout, stale_tmp_s=0.0)
    assert not tmp.exists()
    assert s2.stats().num_blocks == 2 and s2.stats().num_corrupt == 2
    assert s2.match_prefix(toks) == hashes[:2]
    assert np.array_equal(s2.read_full(hashes[1]), datas[1])
    # a young temp file of a writer that may still be running is left alone
    tmp.write_bytes(b"partial")
    BlockStore(tmp_path, layout)
    assert tmp.exists()


def test_truncated_file_found_at_read(store: BlockStore, layout: BlockLayout, make_blocks) -> None:
    hashes, datas = make_blocks(store, np.arange(8))
    with open(block_path(store.root, hashes[0]), "r+b") as f:
        f.truncate(header_bytes_for(layout) + layout.layer_block_bytes)
    assert np.array_equal(store.read_layer(hashes[0], 0), datas[0][: layout.layer_block_bytes])
    assert store.read_layer(hashes[0], 1) is None
    assert store.stats().num_corrupt == 1


def test_index_rebuild(tmp_path: Path, layout: BlockLayout, make_blocks) -> None:
    s = BlockStore(tmp_path, layout)
    a, _ = make_blocks(s, np.arange(32))
    b, _ = make_blocks(s, np.r_[np.arange(8), np.arange(100, 116)], seed=1)  # shares block 0
    assert b[0] == a[0]
    s2 = BlockStore(tmp_path, layout)
    assert sorted(s2.known_hashes()) == sorted(set(a) | set(b))
    assert s2.parent_of(a[3]) == a[2] and s2.parent_of(a[0]) is None
    assert s2.match_prefix(np.arange(40)) == a
    assert s2.stats().used_bytes == 6 * file_bytes_for(layout)


def test_lru_evicts_leaves_only(tmp_path: Path, layout: BlockLayout, make_blocks) -> None:
    fb = file_bytes_for(layout)
    s = BlockStore(tmp_path, layout, capacity_bytes=4 * fb)
    a, _ = make_blocks(s, np.arange(24))  # chain a0 <- a1 <- a2
    s.match_prefix(np.arange(24))  # a0 is the oldest, but interior
    b, _ = make_blocks(s, np.arange(200, 208), seed=1)  # b0: 4 blocks, at capacity
    assert s.stats().num_evictions == 0
    c, _ = make_blocks(s, np.arange(300, 308), seed=2)  # over: evict LRU leaf = a2, not a0/a1
    assert s.stats().num_evictions == 1
    assert not s.contains(a[2]) and s.contains(a[0]) and s.contains(a[1])
    assert not block_path(s.root, a[2]).exists()
    s.pin([b[0]])
    make_blocks(s, np.arange(400, 408), seed=3)  # now a1 is the LRU leaf; b0 pinned anyway
    assert not s.contains(a[1]) and s.contains(b[0])
    assert s.stats().used_bytes <= 4 * fb


def test_rebuild_respects_capacity(tmp_path: Path, layout: BlockLayout, make_blocks) -> None:
    s = BlockStore(tmp_path, layout)
    a, _ = make_blocks(s, np.arange(40))
    s2 = BlockStore(tmp_path, layout, capacity_bytes=2 * file_bytes_for(layout))
    assert s2.stats().num_blocks == 2
    assert s2.match_prefix(np.arange(40)) == a[:2]  # the deepest blocks went first


def test_vanished_file_is_a_miss(store: BlockStore, make_blocks) -> None:
    hashes, _ = make_blocks(store, np.arange(16))
    os.unlink(block_path(store.root, hashes[1]))  # e.g. another process evicted it
    assert store.read_full(hashes[1]) is None
    assert store.stats().num_read_misses == 1 and store.stats().num_corrupt == 0
    assert store.match_prefix(np.arange(16)) == hashes[:1]
    assert block_hash(None, np.arange(8)) == hashes[0]


def test_fast_crc_matches_zlib() -> None:
    """Files stay readable with or without the optional isal package: same crc32 values."""
    import zlib

    from dualpath.runtime.kvstore import blockfile

    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8)
    assert blockfile._crc32(data) == zlib.crc32(data)
    assert blockfile._crc32(data[5:77], 12345) == zlib.crc32(data[5:77], 12345)


def test_direct_io_reads_match(tmp_path: Path, make_blocks) -> None:
    """O_DIRECT into aligned pool buffers, buffered fallback for unaligned ones: same bytes."""
    from dualpath.runtime.kvstore import BufferPool

    layout = BlockLayout(num_layers=2, kv_bytes_per_token_layer=512, block_size=8)  # 4 KiB layers
    s = BlockStore(tmp_path, layout, direct_io=True)
    hashes, datas = make_blocks(s, np.arange(16))
    pool = BufferPool(layout.full_block_bytes, 2)
    lease = pool.acquire()
    assert lease.array.ctypes.data % 4096 == 0
    assert s.read_full_into(hashes[1], lease.array) and np.array_equal(lease.array, datas[1])
    unaligned = np.empty(layout.full_block_bytes + 1, np.uint8)[1:]
    assert s.read_full_into(hashes[0], unaligned) and np.array_equal(unaligned, datas[0])
    got = s.read_layer(hashes[1], 1)
    assert got is not None and np.array_equal(got, datas[1][4096:])
    _flip_byte(block_path(s.root, hashes[0]), header_bytes_for(layout) + 7)
    assert not s.read_full_into(hashes[0], lease.array)
    assert s.stats().num_corrupt == 1
