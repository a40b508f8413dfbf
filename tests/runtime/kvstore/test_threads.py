"""Thread safety: concurrent writers, readers and evictions in one process."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np

from dualpath.runtime.kvstore import BlockLayout, BlockStore, chain_hashes
from dualpath.runtime.kvstore.blockfile import file_bytes_for


def test_concurrent_writes_reads_and_evictions(tmp_path: Path, layout: BlockLayout) -> None:
    capacity = 12 * file_bytes_for(layout)
    store = BlockStore(tmp_path, layout, capacity_bytes=capacity)
    bs = layout.block_size
    errors: list[str] = []

    def data_for(h: str) -> np.ndarray:
        return np.full(layout.full_block_bytes, int(h[:2], 16), np.uint8)

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            toks = np.r_[np.arange(bs), rng.integers(0, 4, 3 * bs)]  # shared root, small alphabet
            hashes = chain_hashes(toks, bs)
            parent = None
            for i, h in enumerate(hashes):
                store.write_full(h, parent, toks[i * bs : (i + 1) * bs], data_for(h))
                parent = h
            for h in store.match_prefix(toks):
                got = store.read_full(h)  # may be a miss if evicted meanwhile, never wrong data
                if got is not None and not np.array_equal(got, data_for(h)):
                    errors.append(h)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(old_interval)
    st = store.stats()
    assert errors == [] and st.num_corrupt == 0
    assert st.used_bytes <= capacity and st.num_evictions > 0
    # the index and the directory agree after all that
    on_disk = sorted(p.name[:32] for p in tmp_path.glob("??/*.kvb"))
    assert on_disk == sorted(store.known_hashes())
    reopened = BlockStore(tmp_path, layout)
    assert sorted(reopened.known_hashes()) == on_disk
