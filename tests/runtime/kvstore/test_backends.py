"""The store's guarantees on every storage backend (posix, nixl-posix, mooncake): round trips,
the prefix index across stores, checksums with quarantine and healing, truncation, atomic
visibility under concurrent readers, vanished blocks as misses, LRU eviction of leaves. Each test
runs once per backend (``open_store``); a backend that cannot import here is skipped with why."""

from __future__ import annotations

import threading

import numpy as np

from dualpath.runtime.kvstore import BlockLayout, chain_hashes

from .backends import Opener, put_raw, quarantined, raw
from .conftest import LAYOUT, make_blocks


def test_round_trip_and_idempotent_write(open_store: Opener) -> None:
    store = open_store(LAYOUT)
    toks = np.arange(40)
    hashes, datas = make_blocks(store, toks)
    for h, d in zip(hashes, datas, strict=True):
        assert np.array_equal(store.read_full(h), d)
        for layer in range(LAYOUT.num_layers):
            a, b = LAYOUT.layer_range(layer)
            assert np.array_equal(store.read_layer(h, layer), d[a:b])
    assert store.write_full(hashes[0], None, toks[:8], datas[0]) is False  # already there
    assert store.read_full("0" * 32) is None
    st = store.stats()
    assert (
        st.num_writes == 5 and st.num_full_reads == 5 and st.num_layer_reads == 20 and st.num_read_misses == 1
    )


def test_prefix_index_finds_another_stores_blocks(open_store: Opener) -> None:
    writer, reader = open_store(LAYOUT), open_store(LAYOUT)
    toks = np.arange(40)
    hashes, datas = make_blocks(writer, toks[:24])
    assert reader.match_prefix(toks) == hashes  # 3 of 5 whole blocks, found by lookup
    changed = toks.copy()
    changed[10] = 999
    assert reader.match_prefix(changed) == hashes[:1]
    assert reader.stats().num_discovered == 3 and np.array_equal(reader.read_full(hashes[2]), datas[2])
    assert writer.discard(hashes[2])  # gone behind the reader's index: a miss, not an error
    assert reader.read_full(hashes[2]) is None and reader.match_prefix(toks) == hashes[:2]


def test_bad_checksum_is_quarantined_miss_then_healed(open_store: Opener) -> None:
    store = open_store(LAYOUT)
    toks = np.arange(16)
    hashes, datas = make_blocks(store, toks)
    good = raw(store, hashes[1])
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # the last layer's last byte
    put_raw(store, hashes[1], bytes(bad))
    assert store.read_layer(hashes[1], 0) is not None  # layer 0 verifies alone and is intact
    assert store.read_layer(hashes[1], LAYOUT.num_layers - 1) is None
    st = store.stats()
    assert st.num_corrupt == 1 and quarantined(store) == 1
    other = open_store(LAYOUT)
    assert other.match_prefix(toks) == hashes[:1]  # moved aside: no store finds it any more
    assert store.write_full(hashes[1], hashes[0], toks[8:], datas[1])  # rewritten: healed
    assert store.stats().num_rewrites == 1 and np.array_equal(other.read_full(hashes[1]), datas[1])


def test_bad_header_and_truncation_are_caught(open_store: Opener) -> None:
    store = open_store(LAYOUT)
    toks = np.arange(24)
    hashes, _ = make_blocks(store, toks)
    body = raw(store, hashes[0])
    put_raw(store, hashes[0], body[:100] + bytes([body[100] ^ 1]) + body[101:])  # in the header's ids
    put_raw(store, hashes[2], body[: len(body) - 7])  # short
    fresh = open_store(LAYOUT)
    assert fresh.match_prefix(toks) == []  # the root's header fails: nothing matches
    assert fresh.read_full(hashes[2]) is None
    assert fresh.stats().num_corrupt == 2 and quarantined(fresh) == 2
    assert np.array_equal(fresh.read_full(hashes[1]), store.read_full(hashes[1]))


def test_writes_are_atomic_to_concurrent_readers(open_store: Opener) -> None:
    big = BlockLayout(num_layers=8, kv_bytes_per_token_layer=4096, block_size=16)  # 512 KiB blocks
    writer, reader = open_store(big, None), open_store(big, None)
    toks = np.arange(16 * 24)
    hashes = chain_hashes(toks, 16)
    datas = [np.full(big.full_block_bytes, i + 1, dtype=np.uint8) for i in range(len(hashes))]
    seen, bad, done = set(), [], threading.Event()

    def poll() -> None:
        out = np.empty(big.full_block_bytes, dtype=np.uint8)
        while not done.is_set() or len(seen) < len(hashes):
            for i, h in enumerate(hashes):
                if h not in seen and reader.read_full_into(h, out):
                    (seen.add(h) if np.array_equal(out, datas[i]) else bad.append(h))
            if done.is_set() and len(seen) < len(hashes) and reader.stats().num_corrupt:
                break

    threads = [threading.Thread(target=poll) for _ in range(2)]
    for t in threads:
        t.start()
    parent = None
    for i, h in enumerate(hashes):
        assert writer.write_full(h, parent, toks[16 * i : 16 * (i + 1)], datas[i])
        parent = h
    done.set()
    for t in threads:
        t.join(60)
    assert not bad and len(seen) == len(hashes)
    assert reader.stats().num_corrupt == 0  # never a partial block: a miss or the whole of it


def test_capacity_evicts_lru_leaves_on_each_backend(open_store: Opener) -> None:
    per = open_store(LAYOUT, None).file_bytes
    store = open_store(LAYOUT, 4 * per)
    a, _ = make_blocks(store, np.arange(24))  # a chain of 3
    b, _ = make_blocks(store, np.arange(100, 116), seed=1)  # a chain of 2: 5 > 4, one goes
    st = store.stats()
    assert st.num_blocks == 4 and st.num_evictions == 1
    assert not store.contains(a[2]) and all(store.contains(h) for h in a[:2] + b)  # the LRU leaf
    assert open_store(LAYOUT).match_prefix(np.arange(24)) == a[:2]  # deleted on the backend too


def test_nixl_posix_reuses_registrations_and_never_a_stale_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """nixl-posix keeps a pooled buffer's registration and a file's while its fd names that file;
    an fd number reused for another file reads that file's bytes (its stale registration dropped)."""
    import os

    import pytest

    from dualpath.core.errors import ConfigError

    try:
        from dualpath.runtime.kvstore.nixl_backend import NixlFileIO

        io = NixlFileIO()
    except ConfigError as exc:
        pytest.skip(f"nixl-posix not importable here: {exc.reason}")
    try:
        a, b = tmp_path / "a", tmp_path / "b"
        a.write_bytes(b"A" * 8192)
        b.write_bytes(b"B" * 8192)
        buf = np.zeros(8192, dtype=np.uint8)
        fd = os.open(a, os.O_RDONLY)
        for _ in range(2):
            assert io.readv(fd, [memoryview(buf)], 0) == 8192 and bytes(buf) == b"A" * 8192
        os.close(fd)
        regs = io._local.regs
        assert regs.hits == 2 and regs.misses == 2  # buffer and file once each, then reused
        fd2 = os.open(b, os.O_RDONLY)
        try:
            assert fd2 == fd  # the lowest free number: the same fd now names b
            assert io.readv(fd2, [memoryview(buf)], 0) == 8192 and bytes(buf) == b"B" * 8192
        finally:
            os.close(fd2)
        assert regs.misses == 3 and len(regs._files) == 1
    finally:
        io.close()
