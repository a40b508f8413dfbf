from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualpath.core.errors import ConfigError
from dualpath.runtime.kvstore import BlockLayout, BlockStore, block_hash, chain_hashes

from .backends import Opener
from .conftest import LAYOUT as BACKEND_LAYOUT

LAYOUT = BlockLayout(num_layers=4, kv_bytes_per_token_layer=16, block_size=8)  # as conftest


@pytest.fixture
def store(open_store: Opener) -> BlockStore:
    """This module's ``store`` tests run once per storage backend (skipped where one cannot import)."""
    return open_store(BACKEND_LAYOUT)


def test_layout_sizes_and_validation() -> None:
    smol = BlockLayout(num_layers=30, kv_bytes_per_token_layer=768)
    assert smol.block_size == 64
    assert smol.full_block_bytes == 1_474_560
    assert smol.layer_range(2) == (2 * 64 * 768, 3 * 64 * 768)
    with pytest.raises(ConfigError, match="num_layers=0"):
        BlockLayout(num_layers=0, kv_bytes_per_token_layer=1)
    with pytest.raises(ConfigError, match="layer=30"):
        smol.layer_range(30)


def test_block_hash_is_a_stable_chain() -> None:
    a = block_hash(None, [1, 2, 3])
    assert a == block_hash(None, np.array([1, 2, 3], dtype=np.int32))
    assert len(a) == 32 and int(a, 16) >= 0
    assert block_hash(a, [4]) != block_hash(None, [4])
    assert block_hash(None, [1, 2, 4]) != a
    # fixed values: hashes name files on disk, so they must never change between versions
    assert block_hash(None, range(64)) == "0f032ceda9bd5b4a8b72e642b132e4b9"
    assert block_hash(block_hash(None, range(64)), [7] * 64) == "42d456748dad4ef3ab73708bdae22708"
    assert block_hash(None, list(range(8))) == block_hash(None, tuple(range(8)))
    assert chain_hashes(list(range(20)), 8) == [
        block_hash(None, range(8)),
        block_hash(block_hash(None, range(8)), range(8, 16)),
    ]


def test_round_trip_full_and_layer(store: BlockStore, make_blocks) -> None:
    toks = np.arange(40)
    hashes, datas = make_blocks(store, toks)
    assert len(hashes) == 5
    for h, d in zip(hashes, datas, strict=True):
        full = store.read_full(h)
        assert full is not None and np.array_equal(full, d)
        for layer in range(LAYOUT.num_layers):
            a, b = LAYOUT.layer_range(layer)
            got = store.read_layer(h, layer)
            assert got is not None and np.array_equal(got, full[a:b])
            assert np.array_equal(LAYOUT.layer_view(full, layer), got)
    out = np.empty(LAYOUT.full_block_bytes, dtype=np.uint8)
    assert store.read_full_into(hashes[2], out) and np.array_equal(out, datas[2])
    assert store.read_full("0" * 32) is None


def test_match_prefix_partial(store: BlockStore, make_blocks) -> None:
    toks = np.arange(40)
    hashes, _ = make_blocks(store, toks[:24])
    assert store.match_prefix(toks) == hashes  # 3 of 5 blocks cached
    assert store.match_prefix(toks[:23]) == hashes[:2]  # partial last block is not matched
    changed = toks.copy()
    changed[10] = 999  # second block differs: only the first matches
    assert store.match_prefix(changed) == hashes[:1]
    changed[0] = 999
    assert store.match_prefix(changed) == []
    st = store.stats()
    assert st.hit_tokens == 24 + 16 + 8 and st.num_blocks == 3


def test_write_is_idempotent_and_checked(store: BlockStore) -> None:
    toks = np.arange(8)
    h = block_hash(None, toks)
    data = np.ones(LAYOUT.full_block_bytes, dtype=np.uint8)
    assert store.write_full(h, None, toks, data) is True
    assert store.write_full(h, None, toks, data) is False
    with pytest.raises(ConfigError, match="block_hash"):
        store.write_full(block_hash(None, toks + 1), None, toks, data)
    with pytest.raises(ConfigError, match="data"):
        store.write_full(block_hash(None, toks + 1), None, toks + 1, data[:-1])
    with pytest.raises(ConfigError, match="token_ids"):
        store.write_full(block_hash(None, toks[:4]), None, toks[:4], data)


def test_layout_mismatch_refused(tmp_path: Path) -> None:
    BlockStore(tmp_path, LAYOUT)
    with pytest.raises(ConfigError, match="another layout"):
        BlockStore(tmp_path, BlockLayout(num_layers=5, kv_bytes_per_token_layer=16, block_size=8))


def test_data_may_be_any_contiguous_buffer(store: BlockStore) -> None:
    toks = np.arange(8)
    h = block_hash(None, toks)
    data = np.arange(LAYOUT.full_block_bytes // 4, dtype=np.float32).reshape(LAYOUT.num_layers, -1)
    store.write_full(h, None, toks, data)
    got = store.read_full(h)
    assert got is not None and np.array_equal(got.view(np.float32).reshape(data.shape), data)


def test_fsync_writes_and_buffer_pool_bounds(tmp_path: Path) -> None:
    from dualpath.runtime.kvstore import BufferPool

    s = BlockStore(tmp_path, LAYOUT, fsync=True)
    toks = np.arange(8)
    h = block_hash(None, toks)
    data = np.arange(LAYOUT.full_block_bytes, dtype=np.uint32).astype(np.uint8)
    assert s.write_full(h, None, toks, data)
    assert np.array_equal(BlockStore(tmp_path, LAYOUT).read_full(h), data)
    pool = BufferPool.bounded(3 * 4096 + 100, 4096)
    assert pool.num_buffers == 3 and pool.capacity_bytes == 3 * 4096
    leases = [pool.try_acquire() for _ in range(4)]
    assert leases[3] is None and all(lease is not None for lease in leases[:3])
    assert len({lease.array.ctypes.data for lease in leases[:3] if lease}) == 3
    with pytest.raises(ConfigError, match="capacity_bytes"):
        BufferPool.bounded(100, 4096)
