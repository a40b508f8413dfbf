"""Layerwise reads of store hits (the connector's load thread) against a real block store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualpath.core.errors import ConfigError
from dualpath.integrations.vllm.loadjob import LoadJob
from dualpath.integrations.vllm.settings import ConnectorSettings
from dualpath.runtime.kvstore import BlockLayout, BlockStore, TokenBucket
from dualpath.runtime.kvstore.files import block_path

from .conftest import filled_store

LAYOUT = BlockLayout(num_layers=3, kv_bytes_per_token_layer=8, block_size=4)


def _store(tmp_path: Path, tokens: list[int]) -> tuple[BlockStore, list[str], list[np.ndarray]]:
    return filled_store(tmp_path, tokens, LAYOUT, seed=0)


def test_every_layer_of_every_hit_block_arrives_intact(tmp_path: Path) -> None:
    store, hashes, blocks = _store(tmp_path, list(range(12)))
    job = LoadJob(store, [hashes, hashes[:1]])
    for layer in range(LAYOUT.num_layers):
        got = job.wait(layer)
        assert len(got[0]) == 3 and len(got[1]) == 1
        for j in range(3):
            assert np.array_equal(got[0][j], LAYOUT.layer_view(blocks[j], layer))
        job.release(layer)
    assert job.finish() == [3, 1] and job.read_bytes == 4 * 3 * LAYOUT.layer_block_bytes


def test_a_corrupt_block_ends_the_good_prefix(tmp_path: Path) -> None:
    store, hashes, _ = _store(tmp_path, list(range(16)))
    path = block_path(store.root, hashes[1])
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # last layer of block 1
    path.write_bytes(bytes(raw))
    job = LoadJob(store, [hashes])
    assert job.finish() == [1]  # block 1 (and so 2, 3) a miss; block 0 good in every layer
    assert store.stats().num_corrupt == 1 and not store.contains(hashes[1])


def test_a_vanished_block_is_a_miss(tmp_path: Path) -> None:
    store, hashes, _ = _store(tmp_path, list(range(8)))
    block_path(store.root, hashes[0]).unlink()
    assert LoadJob(store, [hashes]).finish() == [0]


class _Recording(TokenBucket):
    def __init__(self) -> None:
        super().__init__(1e15)
        self.booked: list[int] = []

    def reserve(self, nbytes: int) -> float:
        self.booked.append(nbytes)
        return super().reserve(nbytes)


def test_reads_book_their_bytes_on_the_storage_nic(tmp_path: Path) -> None:
    store, hashes, _ = _store(tmp_path, list(range(8)))
    nic = _Recording()
    LoadJob(store, [hashes], limiter=nic).finish()
    assert nic.booked == [LAYOUT.layer_block_bytes] * (2 * LAYOUT.num_layers)


def test_snic_settings() -> None:
    s = ConnectorSettings.from_extra({"store_dir": "/x", "snic_gbps": 8}, vllm_block_size=16)
    read, write = s.snic_limiters()
    assert read is not None and write is not None and read is not write
    assert read.rate_bytes_per_s == 1e9
    assert ConnectorSettings.from_extra({"store_dir": "/x"}, vllm_block_size=16).snic_limiters() == (
        None,
        None,
    )
    with pytest.raises(ConfigError, match="snic_gbps"):
        ConnectorSettings.from_extra({"store_dir": "/x", "snic_gbps": 0}, vllm_block_size=16)
