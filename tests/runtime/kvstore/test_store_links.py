"""The block store touches only what it created (issue 30, item 1): symlinks planted inside the
KV directory (a block file, a shard directory, ``quarantine``) are refused, counted and moved into
quarantine as links, never followed; nothing outside the directory changes; pruning deletes only
files the store itself quarantined."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

from dualpath.runtime.kvstore import BlockLayout, BlockStore, chain_hashes
from dualpath.runtime.kvstore.files import QUARANTINE_DIR, block_path

from .conftest import make_blocks

HOUR_S = 3600.0


def snapshot(root: Path) -> dict[str, tuple[int, int, float, str]]:
    """Every entry under ``root`` (not following links): mode, size, mtime and content digest."""
    out: dict[str, tuple[int, int, float, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime, digest)
    out["."] = (root.lstat().st_mode, 0, 0.0, "")
    return out


def tokens_with_first_block_in(shard: str, layout: BlockLayout) -> np.ndarray:
    """Token ids whose first block's hash starts with ``shard`` (found by trying seeds)."""
    for seed in range(100_000):
        ids = np.random.default_rng(seed).integers(0, 1000, layout.block_size)
        if chain_hashes(ids, layout.block_size)[0].startswith(shard):
            return ids
    raise AssertionError(f"no token block hashing into shard {shard}")  # pragma: no cover


def plant(tmp_path: Path, layout: BlockLayout) -> tuple[Path, Path, str]:
    """A KV directory holding the issue's three links into ``outside/`` (plus a stale temp file
    and 40 files there); returns (kv dir, outside dir, the hash whose block file is a link)."""
    kv, outside = tmp_path / "kv", tmp_path / "outside"
    BlockStore(kv, layout).close()  # an existing store tree, as on a restart
    for name in ("victim", "shard", "quarantine"):
        (outside / name).mkdir(parents=True)
        (outside / name).chmod(0o755)
    victim = outside / "victim" / "precious.txt"
    victim.write_text("not a KV block")
    victim.chmod(0o644)
    stale = outside / "shard" / ".tmp.0123.99.0"
    stale.write_text("someone else's temp file")
    os.utime(stale, (time.time() - HOUR_S, time.time() - HOUR_S))
    for i in range(40):
        (outside / "quarantine" / f"keep{i:02d}.kvb").write_text(f"file {i}")
    linked = "cd" + "0" * 30
    os.symlink(victim, block_path(kv, linked))  # block file -> outside file
    (kv / "ab").rmdir()
    os.symlink(outside / "shard", kv / "ab")  # shard directory -> outside directory
    (kv / QUARANTINE_DIR).rmdir()
    os.symlink(outside / "quarantine", kv / QUARANTINE_DIR)  # quarantine -> outside directory
    return kv, outside, linked


def assert_links_quarantined(kv: Path, want: int) -> None:
    qdir = kv / QUARANTINE_DIR
    assert not qdir.is_symlink() and qdir.is_dir()
    assert not (kv / "ab").is_symlink() and (kv / "ab").is_dir()
    links = [p for p in qdir.iterdir() if p.is_symlink()]
    assert len(links) == want and all(p.name.endswith(".link") for p in links), links


def test_planted_links_are_refused_and_nothing_outside_changes(
    tmp_path: Path, layout: BlockLayout, caplog: pytest.LogCaptureFixture
) -> None:
    kv, outside, linked = plant(tmp_path, layout)
    before = snapshot(outside)
    with caplog.at_level(logging.WARNING, logger="dualpath.runtime.kvstore"):
        store = BlockStore(kv, layout, stale_tmp_s=60.0)  # open: scan, chmod, stale-temp cleanup
        assert store.read_full(linked) is None  # the linked file is never read nor served
        ids = tokens_with_first_block_in("ab", layout)
        hashes, datas = make_blocks(store, ids)  # written into a fresh shard, not through the link
        assert (kv / "ab" / f"{hashes[0]}.kvb").is_file()
        got = store.read_full(hashes[0])
        assert got is not None and np.array_equal(got, datas[0])
        corrupt = block_path(kv, hashes[0])
        corrupt.write_bytes(corrupt.read_bytes()[:100])  # quarantined, then quarantine is pruned
        assert store.read_full(hashes[0]) is None
    assert snapshot(outside) == before
    assert store.stats().num_links_refused == 3
    assert_links_quarantined(kv, 3)
    refusals = [r for r in caplog.records if "symlink" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]  # logged once, then counted
    store.close()


def test_a_second_process_view_sees_no_links_either(tmp_path: Path, layout: BlockLayout) -> None:
    """A link planted after the store opened (between its checks) is refused at use."""
    store = BlockStore(tmp_path / "kv", layout)
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o755)
    ids = tokens_with_first_block_in("ef", layout)
    (store.root / "ef").rmdir()
    os.symlink(outside, store.root / "ef")
    before = snapshot(outside)
    hashes, _ = make_blocks(store, ids)
    assert snapshot(outside) == before
    assert (store.root / "ef" / f"{hashes[0]}.kvb").is_file()
    assert store.stats().num_links_refused == 1
    store.close()


def test_hard_linked_outside_file_keeps_its_mode(tmp_path: Path, layout: BlockLayout) -> None:
    """Our files have one name; a second name (hard link) is read but never chmodded."""
    store = BlockStore(tmp_path / "kv", layout)
    hashes, _ = make_blocks(store, tokens_with_first_block_in("12", layout))
    store.close()
    outside = tmp_path / "outside.kvb"
    os.link(block_path(store.root, hashes[0]), outside)
    outside.chmod(0o644)
    BlockStore(tmp_path / "kv", layout).close()
    assert outside.stat().st_mode & 0o777 == 0o644


def test_pruning_deletes_only_what_the_store_quarantined(tmp_path: Path, layout: BlockLayout) -> None:
    store = BlockStore(tmp_path / "kv", layout)
    qdir = store.root / QUARANTINE_DIR
    foreign = []
    for i in range(40):  # an operator's files in the (real) quarantine directory
        p = qdir / (f"keep{i:02d}.kvb" if i % 2 else f"{'0' * 32}.1.{i}.kvb")
        p.write_text(f"not quarantined by the store {i}")
        foreign.append(p)
    ids = np.arange(40 * layout.block_size) % 500
    hashes, _ = make_blocks(store, ids)
    for h in hashes:  # truncate and read: 40 quarantines, pruned to the last 32 of the store's
        p = block_path(store.root, h)
        p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])
        assert store.read_full(h) is None
    assert all(p.exists() for p in foreign)
    ours = [p for p in qdir.iterdir() if p not in foreign]
    assert len(ours) == 32
    store.close()


@pytest.mark.slow
def test_a_plain_serve_start_follows_no_planted_link(tmp_path: Path, layout: BlockLayout) -> None:
    """``dualpath serve`` (tiny model: scheduler, engines and the standby all open the store) on a
    KV directory holding the three links: the outside files keep mode, content and count."""
    from ..faults.serve_proc import served

    kv, outside, _ = plant(tmp_path, layout)
    (kv / "kvstore.json").unlink()  # the tiny model's layout, written by serve itself
    before = snapshot(outside)
    with served(kv, tmp_path / "serve.log") as srv:
        assert srv.proc.poll() is None
    assert snapshot(outside) == before
    links = [p for p in (kv / QUARANTINE_DIR).iterdir() if p.is_symlink()]
    assert len(links) == 3, links
