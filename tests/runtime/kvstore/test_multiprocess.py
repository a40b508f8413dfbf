"""Two processes writing and reading one directory at the same time."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import numpy as np

from dualpath.runtime.kvstore import BlockLayout, BlockStore, chain_hashes

LAYOUT = BlockLayout(num_layers=4, kv_bytes_per_token_layer=64, block_size=8)
NUM_BLOCKS = 24


def _data_for(h: str) -> np.ndarray:
    """Deterministic content per hash, so any process can check any block."""
    seed = int(h[:8], 16)
    return np.random.default_rng(seed).integers(0, 256, LAYOUT.full_block_bytes, dtype=np.uint8)


def _worker(root: str, seed: int, result: mp.Queue) -> None:  # type: ignore[type-arg]
    store = BlockStore(root, LAYOUT, stale_tmp_s=0.0)
    toks = np.arange(NUM_BLOCKS * LAYOUT.block_size)  # both processes write the same chain
    hashes = chain_hashes(toks, LAYOUT.block_size)
    bs = LAYOUT.block_size
    order = np.random.default_rng(seed).permutation(NUM_BLOCKS)
    bad = 0
    for i in order:  # write in a random order, reading back what the other may have written
        parent = hashes[i - 1] if i else None
        store.write_full(hashes[i], parent, toks[i * bs : (i + 1) * bs], _data_for(hashes[i]))
        for h in store.match_prefix(toks):
            got = store.read_full(h)
            bad += got is None or not np.array_equal(got, _data_for(h))
    result.put((bad, store.stats().num_corrupt, store.match_prefix(toks) == hashes))


def test_two_processes_share_a_directory(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), s, result)) for s in (1, 2)]
    for p in procs:
        p.start()
    outcomes = [result.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert outcomes == [(0, 0, True), (0, 0, True)]
    # a third process sees everything and nothing is left over
    store = BlockStore(tmp_path, LAYOUT, stale_tmp_s=0.0)
    assert store.stats().num_blocks == NUM_BLOCKS
    assert not [p for p in tmp_path.rglob(".tmp.*")]


def test_blocks_written_elsewhere_are_discovered(tmp_path: Path) -> None:
    a = BlockStore(tmp_path, LAYOUT)
    b = BlockStore(tmp_path, LAYOUT)  # opened before a writes: its index is empty
    toks = np.arange(3 * LAYOUT.block_size)
    hashes = chain_hashes(toks, LAYOUT.block_size)
    parent = None
    for i, h in enumerate(hashes):
        a.write_full(h, parent, toks[i * 8 : (i + 1) * 8], _data_for(h))
        parent = h
    assert b.match_prefix(toks) == hashes
    assert b.stats().num_discovered == 3
    assert np.array_equal(b.read_full(hashes[2]), _data_for(hashes[2]))
    assert b.parent_of(hashes[2]) == hashes[1]


def _write_forever(root: str, started: mp.Event) -> None:  # type: ignore[valid-type]
    big = BlockLayout(num_layers=8, kv_bytes_per_token_layer=4096, block_size=64)  # 2 MiB blocks
    store = BlockStore(root, big)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, big.full_block_bytes, dtype=np.uint8)
    for n in range(10_000):
        toks = np.arange(64) + 64 * n
        h = chain_hashes(toks, 64)[0]
        store.write_full(h, None, toks, data)
        if n == 3:
            started.set()


def test_killed_writer_leaves_a_consistent_store(tmp_path: Path) -> None:
    """SIGKILL a process in the middle of writing blocks; the reopened store is consistent."""
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=_write_forever, args=(str(tmp_path), started))
    proc.start()
    assert started.wait(60)
    time.sleep(0.05)
    proc.kill()
    proc.join(timeout=30)
    big = BlockLayout(num_layers=8, kv_bytes_per_token_layer=4096, block_size=64)
    store = BlockStore(tmp_path, big, stale_tmp_s=0.0)
    hashes = store.known_hashes()
    assert len(hashes) >= 4
    assert all(store.read_full(h) is not None for h in hashes)
    assert store.stats().num_corrupt == 0  # atomic rename: no partial block is ever visible
    assert not list(tmp_path.rglob(".tmp.*"))
