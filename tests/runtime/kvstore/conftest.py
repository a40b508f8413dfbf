"""Factories for kvstore tests: a tiny layout, token chains and random block data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dualpath.runtime.kvstore import BlockLayout, BlockStore, chain_hashes
from dualpath.runtime.kvstore.backends import BACKEND_NAMES, MooncakeSpec, missing

from .backends import Opener, opener

LAYOUT = BlockLayout(num_layers=4, kv_bytes_per_token_layer=16, block_size=8)


def make_blocks(
    store: BlockStore, token_ids: np.ndarray, seed: int = 0, parent: str | None = None
) -> tuple[list[str], list[np.ndarray]]:
    """Write every whole block of ``token_ids`` with random data; return (hashes, data)."""
    bs = store.layout.block_size
    rng = np.random.default_rng(seed)
    hashes = chain_hashes(token_ids, bs, parent)
    datas = []
    for i, h in enumerate(hashes):
        data = rng.integers(0, 256, store.layout.full_block_bytes, dtype=np.uint8)
        store.write_full(h, parent, token_ids[i * bs : (i + 1) * bs], data)
        datas.append(data)
        parent = h
    return hashes, datas


@pytest.fixture
def layout() -> BlockLayout:
    return LAYOUT


@pytest.fixture(name="make_blocks")
def make_blocks_fixture():  # type: ignore[no-untyped-def]
    return make_blocks


@pytest.fixture
def store(tmp_path: Path) -> BlockStore:
    return BlockStore(tmp_path / "kv", LAYOUT)


@pytest.fixture(scope="session")
def mooncake_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeSpec | None]:
    """One Mooncake master + holder for the session, started only when a mooncake test asks."""
    if missing("mooncake"):
        yield None
        return
    from dualpath.runtime.kvstore.mooncake_service import MooncakeService

    svc = MooncakeService.start(tmp_path_factory.mktemp("mooncake"), segment_bytes=256 << 20)
    yield svc.spec
    svc.stop()


@pytest.fixture(params=BACKEND_NAMES)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens BlockStores (each another process's view) on one backend's blocks; skipped with the
    reason when the backend's package does not import here."""
    spec = request.getfixturevalue("mooncake_service") if request.param == "mooncake" else None
    open_one, opened = opener(request.param, tmp_path / "kv", spec)
    yield open_one
    for store in opened:
        store.close()
