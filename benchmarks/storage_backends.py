"""The optional storage backends for ``storage_read.py``: a NIXL-POSIX store over the same files,
and the memory mode, a Mooncake Store read against raw Mooncake gets and memcpy of the same bytes."""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dualpath.runtime.kvstore import BlockLayout, BlockStore, block_hash
from dualpath.runtime.kvstore.blockfile import file_bytes_for

HEADROOM = 1.25  # the holder's segment over the data: the master evicts above 90% full


def nixl_store(root: Path, layout: BlockLayout, direct_io: bool = False) -> BlockStore:
    from dualpath.runtime.kvstore.nixl_backend import NixlPosixBackend

    backend = NixlPosixBackend(root, layout, direct_io=direct_io)
    return BlockStore(root, layout, backend=backend, direct_io=direct_io)


def _threads(num: int, work: Callable[[int], None]) -> float:
    """Seconds for ``num`` threads to run ``work(j)`` each."""
    ts = [threading.Thread(target=work, args=(j,)) for j in range(num)]
    start = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - start


def _populate(store: BlockStore, layout: BlockLayout, num_blocks: int) -> list[str]:
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, layout.full_block_bytes, dtype=np.uint8)
    hashes, bs = [], layout.block_size
    for i in range(num_blocks):
        toks = np.arange(bs) + i * bs
        h = block_hash(None, toks)
        if not store.write_full(h, None, toks, payload):
            raise RuntimeError(
                f"writing block {i} into the Mooncake Store failed: {store.stats().write_errors}"
            )
        hashes.append(h)
    return hashes


def _raw_gets(backend: Any, keys: list[str], qd: int, nbytes: int) -> float:
    """GB/s of ``get_into`` of every object, Q threads, one registered buffer each."""
    client = backend._client  # the backend's own client (the same connection the store uses)
    bufs = [np.empty(nbytes, dtype=np.uint8) for _ in range(qd)]
    for b in bufs:
        client.register_buffer(b.ctypes.data, nbytes)
    bad = []

    def work(j: int) -> None:
        for k in keys[j::qd]:
            got = client.get_into(k, bufs[j].ctypes.data, nbytes)
            if got != nbytes:
                bad.append(got)

    try:
        elapsed = _threads(qd, work)
    finally:
        for b in bufs:
            client.unregister_buffer(b.ctypes.data)
    if bad:
        raise RuntimeError(f"{len(bad)} raw Mooncake gets failed (answers {sorted(set(bad))})")
    return len(keys) * nbytes / elapsed / 1e9


def _memcpy(num_blocks: int, threads: int, nbytes: int) -> float:
    """GB/s of copying ``num_blocks`` blocks of ``nbytes`` (numpy, ``threads`` threads)."""
    src = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
    dst = [np.empty(nbytes, dtype=np.uint8) for _ in range(threads)]

    def work(j: int) -> None:
        for _ in range(j, num_blocks, threads):
            np.copyto(dst[j], src)

    return num_blocks * nbytes / _threads(threads, work) / 1e9


def mooncake_runs(
    layout: BlockLayout,
    args: argparse.Namespace,
    store_read_gbs: Callable[..., float],
    timed: Callable[..., Any],
) -> dict[str, list[tuple[float, float]]]:
    """The memory mode's measurements per rep (see storage_read's docstring); ``_gb`` the data."""
    from dualpath.runtime.kvstore.mooncake_backend import MooncakeBackend
    from dualpath.runtime.kvstore.mooncake_service import MooncakeService

    fb, qd = file_bytes_for(layout), args.queue_depth
    num_blocks = max(8, min(args.data_mb, args.mooncake_mb) * 2**20 // fb)
    per_req = max(1, min(args.blocks_per_request, 64 * 2**20 // layout.full_block_bytes))
    runs: dict[str, list[tuple[float, float]]] = {"_gb": [(num_blocks * fb / 1e9, 0.0)]}
    with tempfile.TemporaryDirectory(prefix="dualpath-kvbench-mooncake-") as logs:
        svc = MooncakeService.start(logs, segment_bytes=int(HEADROOM * num_blocks * fb) + (64 << 20))
        try:
            store = BlockStore(logs, layout, None, backend=MooncakeBackend(layout, svc.spec))
            hashes = _populate(store, layout, num_blocks)
            keys = [store.backend.key(h) for h in hashes]  # type: ignore[attr-defined]
            for _ in range(args.reps):
                runs.setdefault("store_mooncake", []).append(
                    timed(lambda: store_read_gbs(store, hashes, qd, per_req))
                )
                runs.setdefault("mooncake_raw", []).append(
                    timed(lambda: _raw_gets(store.backend, keys, qd, fb))
                )
                runs.setdefault(f"memcpy_{qd}threads", []).append(timed(lambda: _memcpy(num_blocks, qd, fb)))
                if qd > 1:
                    runs.setdefault("memcpy_1thread", []).append(timed(lambda: _memcpy(num_blocks, 1, fb)))
            store.close()
        finally:
            svc.stop()
    return runs
