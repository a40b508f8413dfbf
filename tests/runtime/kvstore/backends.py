"""The store's backends for tests: open a BlockStore on each, tamper with a stored block, count
quarantined entries. A backend whose package does not import is skipped with the reason."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from dualpath.runtime.kvstore import BlockLayout, BlockStore
from dualpath.runtime.kvstore.backends import BACKEND_NAMES, missing, open_backend
from dualpath.runtime.kvstore.files import block_path
from dualpath.runtime.kvstore.mooncake_backend import MooncakeBackend, MooncakeSpec

__all__ = ["BACKEND_NAMES", "Opener", "opener", "put_raw", "quarantined", "raw"]
Opener = Callable[..., BlockStore]


def opener(name: str, root: Path, spec: MooncakeSpec | None) -> tuple[Opener, list[BlockStore]]:
    """A function opening a fresh BlockStore (another process's view) on the same blocks, and the
    list of the stores it opened (to close)."""
    why = missing(name)
    if why:
        pytest.skip(f"kv backend {name} unavailable: {why}")
    if spec is not None:  # a namespace of its own: tests never see each other's blocks
        spec = MooncakeSpec(master=spec.master, metadata=spec.metadata, namespace=f"t{uuid.uuid4().hex[:8]}")
    opened: list[BlockStore] = []

    def open_store(layout: BlockLayout, capacity: int | None | str = "auto", **kw: object) -> BlockStore:
        backend = open_backend(name, root, layout, mooncake=spec)
        store = BlockStore(root, layout, capacity, backend=backend, **kw)  # type: ignore[arg-type]
        opened.append(store)
        return store

    return open_store, opened


def raw(store: BlockStore, h: str) -> bytes:
    if isinstance(store.backend, MooncakeBackend):
        got = store.backend.raw(h)
        assert got is not None
        return got
    return block_path(store.root, h).read_bytes()


def put_raw(store: BlockStore, h: str, payload: bytes) -> None:
    """Replace a stored block's bytes behind the store's back (a bad disk, a buggy writer)."""
    if isinstance(store.backend, MooncakeBackend):
        store.backend.put_raw(h, payload)
        return
    path = block_path(store.root, h)
    tmp = path.with_suffix(".tamper")
    tmp.write_bytes(payload)
    os.replace(tmp, path)


def quarantined(store: BlockStore) -> int:
    if isinstance(store.backend, MooncakeBackend):
        return len(store.backend.quarantined())
    return sum(1 for p in (store.root / "quarantine").iterdir() if p.suffix == ".kvb")
