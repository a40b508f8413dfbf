from __future__ import annotations

import multiprocessing as mp
import time
import uuid
from pathlib import Path

import pytest

from dualpath.core.errors import ConfigError
from dualpath.runtime.cluster.traffic import Link, TrafficManager, links_dir


def test_kv_is_fifo_at_link_rate() -> None:
    link = Link("x", 1000.0)
    assert link.reserve(500, "kv", now=10.0) == pytest.approx(10.5)
    assert link.reserve(500, "kv", now=10.0) == pytest.approx(11.0)
    # an idle link starts a transfer at 'now'
    assert link.reserve(100, "kv", now=20.0) == pytest.approx(20.1)


def test_control_overtakes_kv_backlog_and_pushes_kv_back() -> None:
    link = Link("x", 1000.0)
    kv_end = link.reserve(5000, "kv", now=0.0)  # 5 s of KV backlog
    ctl_end = link.reserve(100, "ctl", now=1.0)
    assert ctl_end == pytest.approx(1.1)  # not behind the KV backlog
    assert ctl_end < kv_end
    # the next KV transfer waits for the backlog plus the control bytes
    assert link.reserve(1000, "kv", now=1.0) == pytest.approx(5.0 + 0.1 + 1.0)


def test_uncapped_link_only_counts() -> None:
    link = Link("x", None)
    assert link.reserve(10**9, "kv", now=3.0) == 3.0
    assert link.bytes_by_lane["kv"] == 10**9


def test_bad_lane_and_rate() -> None:
    with pytest.raises(ConfigError):
        Link("x", 0.0)
    with pytest.raises(ConfigError):
        Link("x", 1.0).reserve(1, "bulk")


def _hammer(shared: str, n: int, nbytes: int) -> None:
    link = Link("node0/snic", 2e6, Path(shared))
    for _ in range(n):
        link.transmit(nbytes, "kv")


def test_shared_link_caps_processes_together(tmp_path: Path) -> None:
    """Two processes sharing one emulated SNIC get its rate together, not each."""
    shared = links_dir(uuid.uuid4().hex[:8])
    ctx = mp.get_context("fork")
    t0 = time.monotonic()
    procs = [ctx.Process(target=_hammer, args=(str(shared), 10, 20_000)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    elapsed = time.monotonic() - t0
    ideal = 2 * 10 * 20_000 / 2e6  # 0.2 s at the shared rate
    assert elapsed >= 0.9 * ideal
    assert elapsed < 20 * ideal  # generous: loaded 2-core machine
    for f in shared.iterdir():
        f.unlink()
    shared.rmdir()


def test_traffic_manager_counts_paths_and_nics() -> None:
    tm = TrafficManager(engine_id=3, node_id=2, snic_gbps=None, cnic_gbps=None, shared_dir=None)
    tm.storage_read(100, "de-read")
    tm.storage_write(64)
    tm.kv_send(30)
    paths, nics = tm.snapshot()
    assert paths == {"pe-read": 0, "de-read": 100, "pd-transfer": 30, "persist": 64}
    assert nics == {"node2/snic": 100, "node2/snic:read": 100, "node2/snic-tx": 64, "engine3/cnic": 30}


def test_persists_use_the_other_snic_direction() -> None:
    """NICs are full duplex: a persist does not wait behind reads booked on the node's SNIC."""
    tm = TrafficManager(engine_id=0, node_id=0, snic_gbps=0.008, cnic_gbps=None, shared_dir=None)
    t0 = time.monotonic()
    end = tm.reserve_read(1_000_000, "pe-read")  # 1 MB at 1 MB/s: booked for ~1 s
    assert end - t0 > 0.9
    waited = tm.storage_write(10_000)  # 10 ms on the write direction
    assert waited < 0.5
    tm.close()


def test_read_free_skips_the_wait() -> None:
    tm = TrafficManager(
        engine_id=0, node_id=0, snic_gbps=1e-6, cnic_gbps=1e-6, shared_dir=None, read_free=True
    )
    assert tm.storage_read(10**6, "pe-read") == 0.0
    assert tm.kv_send(10**6) == 0.0
    assert tm.snapshot()[0]["pe-read"] == 10**6


@pytest.mark.parametrize("new_gbps", [None, 10.0])
def test_a_storage_nic_cap_changed_re_times_the_transfers_waiting_under_it(tmp_path: Path, new_gbps) -> None:  # type: ignore[no-untyped-def]
    """Issue 30 item 7: a cap of 1e-4 Gbit/s stalled every storage read for 15+ minutes, and
    removing it did not help the reads already booked. Now a changed cap re-times them: removed,
    they end at once; raised, at the new rate."""
    import threading

    tm = TrafficManager(engine_id=0, node_id=0, snic_gbps=1e-4, cnic_gbps=None, shared_dir=tmp_path / "links")
    end_s = tm.reserve_read(3 * 2**20, "pe-read")  # one SmolLM2 block: ~250 s at 1e-4 Gbit/s
    assert end_s - time.monotonic() > 200
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (tm.wait_read(end_s), done.set()), daemon=True)
    waiter.start()
    assert not done.wait(0.3)
    tm.set_snic_gbps(new_gbps)
    assert done.wait(10.0), "the wait booked under the old cap did not end"
    t0 = time.monotonic()
    tm.wait_read(tm.reserve_read(1 << 20, "pe-read"))  # a new read is not queued behind the old backlog
    assert time.monotonic() - t0 < 5.0
    tm.close()
