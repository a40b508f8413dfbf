"""The KV store in a running local cluster (tiny model): a corrupt block is recomputed, re-persisted
and counted honestly; a small tmpfs as the KV directory evicts instead of failing; a write failure
is logged once and counted while requests go on."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from dualpath.runtime.cluster.api import MetricsSnapshot, SamplingParams, TokenEvent
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.kvstore import BlockLayout, BlockStore, chain_hashes
from dualpath.runtime.kvstore.blockfile import header_bytes_for
from dualpath.runtime.kvstore.files import block_path

BS = 64
PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def _generate(c: LocalCluster, prompts: list[list[int]]) -> list[list[TokenEvent]]:
    async def one(client: ClusterClient, p: list[int]) -> list[TokenEvent]:
        return [ev async for ev in client.generate(p, PARAMS)]

    async def main() -> list[list[TokenEvent]]:
        async with ClusterClient(c.address) as client:
            return list(await asyncio.gather(*(one(client, p) for p in prompts)))

    return asyncio.run(asyncio.wait_for(main(), 120.0))


def _metrics(c: LocalCluster) -> MetricsSnapshot:
    async def main() -> MetricsSnapshot:
        async with ClusterClient(c.address) as client:
            return await client.metrics()

    return asyncio.run(main())


def _configure(c: LocalCluster, policy: str) -> None:
    async def main() -> None:
        async with ClusterClient(c.address) as client:
            await client.configure(policy)

    asyncio.run(main())


def _wait_metrics(c: LocalCluster, ok: Callable[[MetricsSnapshot], bool]) -> MetricsSnapshot:
    """The first snapshot with ``ok`` (engines report their store counters by heartbeat)."""
    deadline = time.monotonic() + 30.0
    while True:
        snap = _metrics(c)
        if ok(snap) or time.monotonic() > deadline:
            return snap
        time.sleep(0.2)


def _reference(c: LocalCluster, prompt: list[int]) -> list[int]:
    """Greedy tokens of a single-process full forward (no cache, no cluster)."""
    from dualpath.runtime.model import load_decoder

    torch.set_num_threads(1)
    dec, _ = load_decoder(str(c.run_dir / "tiny-model"), device="cpu")
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(PARAMS.max_tokens):
            out.append(int(torch.argmax(dec.forward_full(ids)[-1]).item()))
            ids.append(out[-1])
    return out


def _layout(c: LocalCluster) -> BlockLayout:
    from dualpath.runtime.cluster.kvio import Geometry
    from dualpath.runtime.model import load_decoder

    dec, _ = load_decoder(str(c.run_dir / "tiny-model"), device="cpu")
    return Geometry.of(dec, BS).layout()


def _tokens(events: list[TokenEvent]) -> list[int]:
    assert events[-1].finish_reason == "length" and events[-1].error is None, events[-1]
    return [e.token_id for e in events]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    kv = tmp_path_factory.mktemp("kv")
    cfg = ClusterConfig(
        kv_dir=str(kv),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=1,
        engine=EngineConfig(heartbeat_s=0.1),
    )
    with LocalCluster(cfg) as c:
        yield c


@pytest.mark.parametrize("policy,seed,bad", [("basic", 1, 1), ("always-de", 2, 1), ("dualpath-split", 5, 4)])
def test_corrupt_block_is_recomputed_repersisted_and_counted_honestly(
    cluster: LocalCluster, policy: str, seed: int, bad: int
) -> None:
    """Turn 1 persists the prompt's 5 blocks; block ``bad``'s data is then corrupted on disk. Turn 2
    (PE, DE or split read path; a split's DE share is the trailing blocks) loads the blocks before
    it only, recomputes the rest with the same greedy tokens, counts one corrupt block and only the
    loaded blocks as hits, and writes block ``bad`` again; turn 3 hits it."""
    _configure(cluster, policy)
    try:
        rng = random.Random(seed)
        ctx = [rng.randrange(3, 512) for _ in range(5 * BS + 10)]
        assert _tokens(_generate(cluster, [ctx])[0]) == _reference(cluster, ctx)
        before = _metrics(cluster)
        hashes = chain_hashes(ctx, BS)
        path = block_path(Path(cluster.config.kv_dir), hashes[bad])
        layout = _layout(cluster)
        with open(path, "r+b") as f:  # flip bytes inside layer 0's data: only the crc notices
            f.seek(header_bytes_for(layout) + 100)
            f.write(bytes(b ^ 0xFF for b in f.read(16)))
        ctx2 = ctx + [rng.randrange(3, 512) for _ in range(BS)]
        events = _generate(cluster, [ctx2])[0]
        assert _tokens(events) == _reference(cluster, ctx2)  # the answer is unchanged
        assert events[-1].stats is not None and events[-1].stats.hit_len == bad * BS
        assert events[-1].stats.read_side == {"basic": "pe", "always-de": "de"}.get(policy, "split")

        def counted(s: MetricsSnapshot) -> bool:  # (engines report by heartbeat)
            return all(
                s.store_counts.get(k, 0) > before.store_counts.get(k, 0)
                for k in ("corrupt_blocks", "rewritten_blocks")
            )

        snap = _wait_metrics(cluster, counted)
        assert snap.store_counts["corrupt_blocks"] == before.store_counts.get("corrupt_blocks", 0) + 1
        assert snap.hit_tokens - before.hit_tokens == bad * BS  # not the planned 5 blocks
        assert (
            snap.store_counts["failed_hit_tokens"] - before.store_counts.get("failed_hit_tokens", 0)
            == (5 - bad) * BS
        )
        assert snap.store_counts["rewritten_blocks"] > before.store_counts.get("rewritten_blocks", 0)
        check = BlockStore(cluster.config.kv_dir, layout, None)
        assert check.read_full(hashes[bad]) is not None  # re-persisted: the file verifies again
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)
        ctx3 = ctx2 + [rng.randrange(3, 512) for _ in range(BS)]
        events = _generate(cluster, [ctx3])[0]
        assert _tokens(events) == _reference(cluster, ctx3)
        assert events[-1].stats is not None and events[-1].stats.hit_len >= 6 * BS
    finally:
        _configure(cluster, "dualpath")


def test_write_failure_is_logged_once_counted_and_requests_go_on(cluster: LocalCluster) -> None:
    """Files in place of the fan-out directories of a new prompt's blocks: every persist of
    those blocks fails with ENOTDIR; the request still answers right, the failures are counted
    by cause and the engine logs one line for the cause."""
    rng = random.Random(3)
    ctx = [rng.randrange(3, 512) for _ in range(4 * BS + 5)]
    root = Path(cluster.config.kv_dir)
    dirs = {h[:2] for h in chain_hashes(ctx, BS)}
    if any(any(p.name.endswith(".kvb") for p in (root / d).iterdir()) for d in dirs):
        pytest.skip("a fan-out directory of these blocks already holds blocks")  # (seeded: stable)
    for d in dirs:
        os.rmdir(root / d)
        (root / d).write_bytes(b"not a directory")
    try:
        before = _metrics(cluster)
        assert _tokens(_generate(cluster, [ctx])[0]) == _reference(cluster, ctx)
        again = ctx + [rng.randrange(3, 512) for _ in range(10)]  # the same blocks fail again
        assert _tokens(_generate(cluster, [again])[0]) == _reference(cluster, again)
        old = before.store_write_errors.get("ENOTDIR", 0)
        snap = _wait_metrics(cluster, lambda s: s.store_write_errors.get("ENOTDIR", 0) >= old + 8)
        assert snap.store_write_errors.get("ENOTDIR", 0) == old + 8  # 4 blocks, twice
        logs = "".join(p.read_text(errors="replace") for p in cluster.run_dir.glob("engine*.log"))
        assert logs.count("(ENOTDIR:") == 1, logs[-3000:]
    finally:
        for d in dirs:
            (root / d).unlink()
            (root / d).mkdir(mode=0o700)


@pytest.fixture
def tmpfs(mount_tmpfs: Callable[[str], Path]) -> Path:
    return mount_tmpfs("4m")


def test_small_tmpfs_kv_dir_full_disk_then_eviction(tmpfs: Path, fill_disk: Callable[[Path], None]) -> None:
    """A 4 MiB tmpfs as the KV directory (about 28 tiny-model blocks). First another file fills it:
    persists fail with ENOSPC (nothing of ours to evict), logged once, counted, and requests answer
    right. Then, with the space back, 10 prompts of 6 blocks go past the capacity bound (90% of the
    free space at start): LRU leaves are evicted before the disk fills, no write fails."""
    kv = tmpfs / "kv"
    cfg = ClusterConfig(
        kv_dir=str(kv),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=1,
        engine=EngineConfig(heartbeat_s=0.1),
    )
    rng = random.Random(4)
    with LocalCluster(cfg) as c:
        fill_disk(tmpfs / "filler")
        for p in [[rng.randrange(3, 512) for _ in range(3 * BS + 3)] for _ in range(2)]:
            assert _tokens(_generate(c, [p])[0]) == _reference(c, p)
        full = _wait_metrics(c, lambda s: s.store_write_errors.get("ENOSPC", 0) >= 6)
        assert full.store_write_errors.get("ENOSPC", 0) == 6, full  # 3 blocks per prompt
        log = (c.run_dir / f"engine{cfg.num_prefill_engines}.log").read_text(errors="replace")
        assert log.count("(ENOSPC:") == 1, log[-3000:]
        (tmpfs / "filler").unlink()
        prompts = [[rng.randrange(3, 512) for _ in range(6 * BS + 3)] for _ in range(10)]
        for i in range(0, len(prompts), 2):
            for p, events in zip(prompts[i : i + 2], _generate(c, prompts[i : i + 2]), strict=True):
                assert _tokens(events) == _reference(c, p)
        snap = _wait_metrics(c, lambda s: s.store_counts.get("written_blocks", 0) >= 60)
        assert snap.store_counts["written_blocks"] >= 60  # more than the disk holds
        assert snap.store_counts["evictions"] >= 60 - 28
        assert snap.store_write_errors == full.store_write_errors  # evicted before ENOSPC
        st = os.statvfs(tmpfs)
        assert st.f_bavail * st.f_frsize >= 0.09 * 4 * 2**20  # the 10% floor stays free
