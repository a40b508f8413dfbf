"""Capacity, eviction order, healing, write failures and permission bits of the block store."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dualpath.core.errors import ConfigError
from dualpath.runtime.kvstore import BlockLayout, BlockStore, block_hash, chain_hashes
from dualpath.runtime.kvstore.blockfile import file_bytes_for, header_bytes_for
from dualpath.runtime.kvstore.files import block_path
from dualpath.runtime.kvstore.limits import (
    auto_capacity_bytes,
    capacity_from_gb,
    dir_mode_for,
    free_bytes,
    parse_file_mode,
)  # fmt: skip


def _mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o7777


def _corrupt(store: BlockStore, h: str) -> None:
    with open(block_path(store.root, h), "r+b") as f:
        f.seek(header_bytes_for(store.layout) + 3)
        f.write(b"\xff\xfe\xfd")


def _write(store: BlockStore, tokens: np.ndarray, parent: str | None = None, seed: int = 0) -> list[str]:
    """Write every whole block of ``tokens`` after ``parent``; return their hashes."""
    bs = store.layout.block_size
    rng = np.random.default_rng(seed)
    hashes = chain_hashes(tokens, bs, parent)
    for i, h in enumerate(hashes):
        data = rng.integers(0, 256, store.layout.full_block_bytes, dtype=np.uint8)
        store.write_full(h, parent, tokens[i * bs : (i + 1) * bs], data)
        parent = h
    return hashes


# ----------------------------------------------------------------- eviction order
def test_lru_leaf_eviction_order_on_a_branching_tree(tmp_path: Path, layout: BlockLayout) -> None:
    """Chain a0-a1-a2, a branch b1 under a0, chain c0-c1; used C, then A, then the B path. Each
    new root block then evicts one: always the least recently used block without a child."""
    fb = file_bytes_for(layout)
    s = BlockStore(tmp_path, layout, capacity_bytes=6 * fb)
    a = _write(s, np.arange(24))
    b1 = _write(s, np.arange(500, 508), parent=a[0], seed=1)[0]
    c = _write(s, np.arange(300, 316), seed=2)
    s.match_prefix(np.arange(300, 316))
    s.match_prefix(np.arange(24))
    s.match_prefix(np.r_[np.arange(8), np.arange(500, 508)])
    assert s.known_hashes() == [c[0], c[1], a[1], a[2], a[0], b1]  # oldest use first
    order = []
    for k in range(6):
        before = set(s.known_hashes())
        new = _write(s, np.arange(1000 + 8 * k, 1008 + 8 * k), seed=10 + k)
        (gone,) = before - set(s.known_hashes())
        assert not block_path(s.root, gone).exists() and s.contains(new[0])
        order.append(gone)
    assert order == [c[1], c[0], a[2], a[1], b1, a[0]]
    assert s.stats().num_evictions == 6 and s.stats().used_bytes == 6 * fb


def test_default_capacity_is_a_share_of_the_free_space(tmp_path: Path, layout: BlockLayout) -> None:
    s = BlockStore(tmp_path / "kv", layout)
    free = free_bytes(tmp_path)
    cap = s.capacity_bytes
    assert cap is not None and abs(cap - 0.9 * free) < 0.01 * free + 2**20
    _write(s, np.arange(16))
    again = BlockStore(tmp_path / "kv", layout)  # blocks already there count on top of the share
    assert again.capacity_bytes is not None and again.capacity_bytes >= 2 * file_bytes_for(layout)
    assert auto_capacity_bytes(tmp_path / "kv", limit_bytes=12345) == 12345
    assert capacity_from_gb(1e-6, tmp_path / "kv") == 1000
    with pytest.raises(ConfigError, match="kv_capacity_gb"):
        capacity_from_gb(-1.0, tmp_path)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        BlockStore(tmp_path / "kv", layout, capacity_bytes=-1)
    assert BlockStore(tmp_path / "kv", layout, capacity_bytes=None).capacity_bytes is None


# ----------------------------------------------------------------- healing
def test_quarantined_block_is_written_again(store: BlockStore) -> None:
    hashes = _write(store, np.arange(24))
    _corrupt(store, hashes[1])
    assert store.read_full(hashes[1]) is None and store.stats().num_corrupt == 1
    assert store.match_prefix(np.arange(24)) == hashes[:1]
    data = np.full(store.layout.full_block_bytes, 7, dtype=np.uint8)
    assert store.write_full(hashes[1], hashes[0], np.arange(8, 16), data)  # its content came by
    got = store.read_full(hashes[1])
    assert got is not None and (got == 7).all()
    assert store.match_prefix(np.arange(24)) == hashes
    st = store.stats()
    assert st.num_rewrites == 1 and st.num_writes == 4


def test_block_quarantined_by_another_process_is_written_again(tmp_path: Path, layout: BlockLayout) -> None:
    """The cluster's case: the writer (a DE) still indexes a block that a reader (a PE) found
    corrupt and quarantined. Its next write of that block must happen, not be skipped."""
    writer = BlockStore(tmp_path, layout)
    reader = BlockStore(tmp_path, layout)
    hashes = _write(writer, np.arange(16))
    _corrupt(writer, hashes[1])
    assert reader.read_full(hashes[1]) is None and reader.stats().num_corrupt == 1
    data = np.zeros(layout.full_block_bytes, dtype=np.uint8)
    assert writer.write_full(hashes[0], None, np.arange(8), data) is False  # intact: no rewrite
    assert writer.write_full(hashes[1], hashes[0], np.arange(8, 16), data) is True
    assert writer.stats().num_rewrites == 1
    assert reader.read_full(hashes[1]) is not None


def test_forget_makes_the_next_lookup_check_the_files(store: BlockStore) -> None:
    hashes = _write(store, np.arange(16))
    os.unlink(block_path(store.root, hashes[1]))  # another process evicted it
    assert store.match_prefix(np.arange(16)) == hashes  # the index still believes it
    store.forget(hashes[1:])
    assert store.match_prefix(np.arange(16)) == hashes[:1]
    assert block_hash(hashes[0], np.arange(8, 16)) == hashes[1]


# ----------------------------------------------------------------- write failures
def test_write_failure_is_counted_by_cause_and_logged_once(
    store: BlockStore, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = np.arange(800, 832)
    for h in chain_hashes(tokens, store.layout.block_size):
        sub = store.root / h[:2]
        if sub.is_dir():
            for p in sub.iterdir():
                p.unlink()
            sub.rmdir()
            sub.write_bytes(b"x")  # a file where the fan-out directory should be
    with caplog.at_level(logging.WARNING):
        hashes = _write(store, tokens)
        _write(store, tokens, seed=1)
    st = store.stats()
    assert st.write_errors == {"ENOTDIR": 8} and st.num_write_errors == 8 and st.num_writes == 0
    assert sum("ENOTDIR" in r.getMessage() for r in caplog.records) == 1
    assert store.match_prefix(tokens) == [] and store.read_full(hashes[0]) is None


@pytest.fixture
def tmpfs(mount_tmpfs: Callable[[str], Path]) -> Path:
    return mount_tmpfs("1m")


BIG = BlockLayout(num_layers=4, kv_bytes_per_token_layer=1024, block_size=16)  # 68 KiB files


def test_full_disk_evicts_and_retries_instead_of_failing(tmpfs: Path) -> None:
    """A 1 MiB tmpfs holds 15 blocks. Bound above the disk and no free-space floor: writes run
    into ENOSPC, evict LRU leaves and retry; none fails."""
    s = BlockStore(tmpfs / "kv", BIG, capacity_bytes=64 * 2**20, min_free_bytes=0)
    for k in range(40):
        _write(s, np.arange(16 * k, 16 * k + 16), seed=k)
    st = s.stats()
    assert st.num_writes == 40 and st.num_evictions >= 40 - 15 and st.write_errors == {}
    assert s.read_full(chain_hashes(np.arange(16 * 39, 16 * 40), 16)[0]) is not None


def test_free_space_floor_evicts_before_the_disk_fills(tmpfs: Path) -> None:
    s = BlockStore(tmpfs / "kv", BIG, capacity_bytes=64 * 2**20, min_free_bytes=300 * 1024)
    for k in range(40):
        _write(s, np.arange(16 * k, 16 * k + 16), seed=k)
    st = s.stats()
    assert st.num_writes == 40 and st.num_evictions > 0 and st.write_errors == {}
    assert free_bytes(tmpfs) >= 300 * 1024 - file_bytes_for(BIG)


def test_default_bound_on_a_small_disk_never_reaches_enospc(tmpfs: Path) -> None:
    s = BlockStore(tmpfs / "kv", BIG)
    assert s.capacity_bytes is not None and s.capacity_bytes <= 0.9 * 2**20
    for k in range(40):
        _write(s, np.arange(16 * k, 16 * k + 16), seed=k)
    st = s.stats()
    assert st.num_writes == 40 and st.used_bytes <= s.capacity_bytes and st.write_errors == {}


def test_nothing_to_evict_on_a_full_or_read_only_disk_counts_errors(
    tmpfs: Path, fill_disk: Callable[[Path], None]
) -> None:
    s = BlockStore(tmpfs / "kv", BIG, capacity_bytes=None, min_free_bytes=0)
    fill_disk(tmpfs / "filler")
    assert _write(s, np.arange(32)) and s.stats().write_errors == {"ENOSPC": 2}
    assert not [p for p in (tmpfs / "kv").rglob(".tmp.*")]  # no temp file left behind
    os.unlink(tmpfs / "filler")
    ro = subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], capture_output=True, timeout=30)
    if ro.returncode != 0:
        pytest.skip("cannot remount the tmpfs read-only")
    _write(s, np.arange(32))
    assert s.stats().write_errors == {"ENOSPC": 2, "EROFS": 2}


# ----------------------------------------------------------------- permissions
def test_files_are_0600_and_directories_0700(store: BlockStore) -> None:
    hashes = _write(store, np.arange(16))
    assert _mode(block_path(store.root, hashes[0])) == 0o600
    assert _mode(store.root / "kvstore.json") == 0o600
    for d in (store.root, store.root / hashes[0][:2], store.root / "quarantine", store.root / "ff"):
        assert _mode(d) == 0o700, d
    _corrupt(store, hashes[1])
    store.read_full(hashes[1])
    (q,) = (store.root / "quarantine").iterdir()
    assert _mode(q) == 0o600


def test_group_mode_for_shared_file_systems(tmp_path: Path, layout: BlockLayout) -> None:
    old = os.umask(0o077)  # the exact bits are set whatever the umask
    try:
        s = BlockStore(tmp_path / "kv", layout, file_mode=parse_file_mode("0640"))
        hashes = _write(s, np.arange(8))
    finally:
        os.umask(old)
    assert _mode(block_path(s.root, hashes[0])) == 0o640
    assert _mode(s.root) == 0o750 and _mode(s.root / hashes[0][:2]) == 0o750
    assert dir_mode_for(0o660) == 0o770 and dir_mode_for(0o600) == 0o700


def test_an_old_world_readable_tree_is_tightened(tmp_path: Path, layout: BlockLayout) -> None:
    s = BlockStore(tmp_path / "kv", layout)
    hashes = _write(s, np.arange(8))
    os.chmod(block_path(s.root, hashes[0]), 0o644)
    os.chmod(s.root, 0o755)
    os.chmod(s.root / hashes[0][:2], 0o755)
    BlockStore(tmp_path / "kv", layout)
    assert _mode(block_path(s.root, hashes[0])) == 0o600
    assert _mode(s.root) == 0o700 and _mode(s.root / hashes[0][:2]) == 0o700


@pytest.mark.parametrize("text", ["0644", "0700", "0666", "1600", "abc", "0400", "99"])
def test_bad_file_modes_are_config_errors_naming_the_value(text: str) -> None:
    with pytest.raises(ConfigError, match=f"kv_file_mode='{text}'"):
        parse_file_mode(text)


def test_bad_file_mode_in_the_store_and_cluster_config(tmp_path: Path, layout: BlockLayout) -> None:
    from dualpath.runtime.cluster.config import ClusterConfig

    with pytest.raises(ConfigError, match="kv_file_mode='0o644'"):
        BlockStore(tmp_path, layout, file_mode=0o644)
    with pytest.raises(ConfigError, match="kv_file_mode"):
        ClusterConfig(kv_dir=str(tmp_path), kv_file_mode=0o604)
    with pytest.raises(ConfigError, match="kv_capacity_gb"):
        ClusterConfig(kv_dir=str(tmp_path), kv_capacity_gb=0.0)
    assert ClusterConfig(kv_dir=str(tmp_path), kv_file_mode=0o660).kv_file_mode == 0o660
