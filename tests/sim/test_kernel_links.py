from __future__ import annotations

import pytest

from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.driver import Simulation
from dualpath.sim.harness.runner import make_agents
from dualpath.sim.kernel import PRIO_COMPLETE, PRIO_FETCH, Kernel, SimulationError
from dualpath.sim.links import Link, check_utilisation, transfer


def test_kernel_orders_by_time_priority_then_sequence() -> None:
    k = Kernel()
    seen: list[str] = []
    k.at(1.0, lambda: seen.append("fetch"), PRIO_FETCH)
    k.at(1.0, lambda: seen.append("done-a"), PRIO_COMPLETE)
    k.at(1.0, lambda: seen.append("done-b"), PRIO_COMPLETE)
    k.at(0.5, lambda: seen.append("early"))
    h = k.at(0.7, lambda: seen.append("cancelled"))
    h.cancel()
    k.run()
    assert seen == ["early", "done-a", "done-b", "fetch"]
    assert k.now_s == 1.0 and k.events == 4


def test_failed_event_fails_the_run_with_its_time() -> None:
    k = Kernel()
    k.at(2.5, lambda: 1 / 0)
    with pytest.raises(SimulationError, match="t=2.5"):
        k.run()


def test_links_are_fifo_and_paths_end_at_the_slowest_link() -> None:
    fast, slow = Link("f", "x", 100.0), Link("s", "x", 10.0)
    assert transfer((fast, slow), 50.0, 0.0) == pytest.approx(5.0)
    assert fast.free_at_s == pytest.approx(0.5)  # the fast link is not held by the slow one
    assert transfer((slow,), 10.0, 1.0) == pytest.approx(6.0)  # queued behind the first
    assert check_utilisation([fast, slow], 6.0) == pytest.approx(1.0)
    slow.busy_s = 7.0  # more busy time than elapsed time must be caught
    slow.free_at_s = 6.0
    with pytest.raises(AssertionError, match="above 100%"):
        check_utilisation([slow], 6.0)


def test_dram_buffers_stay_bounded_and_bytes_are_conserved(make_cluster, make_trajectories) -> None:
    cluster = make_cluster(1, 1, buffer_gb=2.0)  # tiny buffers: claims must queue
    trajs = make_trajectories(40, turns=5, first=16384, append=200, gen=8)
    sim = Simulation(SimConfig(system=get_system("dualpath"), cluster=cluster), make_agents(trajs))
    result = sim.run()
    assert result["agents_finished"] == 40
    for node, peak in zip(sim.cluster.nodes, sim.storage.peak_buffer, strict=True):
        assert peak <= node.buffer_bytes + 1e-6
    assert result["ttft_breakdown_s"]["allocation"] > 0  # someone waited for buffer room
    assert sim.storage.bytes_read == pytest.approx(sim.metrics.hit_tokens * sim.bpt)


def test_transfer2_and_transfer3_equal_transfer_over_the_same_path() -> None:
    import random

    from dualpath.sim.links import transfer2, transfer3

    rng = random.Random(7)
    for _ in range(200):
        rates = [rng.uniform(1.0, 100.0) for _ in range(3)]
        frees = [rng.uniform(0.0, 5.0) for _ in range(3)]
        nbytes, ready = rng.choice([0.0, rng.uniform(0.0, 500.0)]), rng.uniform(0.0, 5.0)
        for n in (2, 3):
            ref = [Link(f"r{i}", "dram", rates[i]) for i in range(n)]
            ours = [Link(f"o{i}", "dram", rates[i]) for i in range(n)]
            for link, free in zip(ref + ours, frees[:n] * 2):
                link.free_at_s = free
            expected = transfer(ref, nbytes, ready)
            got = transfer2(*ours, nbytes, ready) if n == 2 else transfer3(*ours, nbytes, ready)
            assert got == expected
            assert [(x.free_at_s, x.busy_s, x.kv_bytes) for x in ours] == [
                (x.free_at_s, x.busy_s, x.kv_bytes) for x in ref
            ]
