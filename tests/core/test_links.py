"""The one link model (dualpath.core.links): the simulator's links and the runtime's emulated NICs
book every transfer exactly as it says, and both model a storage NIC's directions the same way."""

from __future__ import annotations

import random

import pytest

from dualpath.core.links import book
from dualpath.runtime.cluster.traffic import Link as NicLink
from dualpath.runtime.cluster.traffic import TrafficManager
from dualpath.sim.cluster import Node
from dualpath.sim.links import Link as SimLink
from dualpath.sim.links import transfer

RATE = 1000.0


def _schedule(seed: int) -> list[tuple[float, int, str]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(200):
        t += rng.expovariate(2.0)
        out.append((t, rng.randint(1, 3000), "ctl" if rng.random() < 0.3 else "kv"))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_sim_and_runtime_links_book_as_the_model(seed: int) -> None:
    state = [0.0, 0.0]
    nic, sim = NicLink("x", RATE), SimLink("x", "snic", RATE)
    for ready_s, nbytes, lane in _schedule(seed):
        want = book(state, ready_s, nbytes / RATE, lane)
        assert nic.reserve(nbytes, lane, now=ready_s) == want
        if lane == "kv":
            assert transfer([sim], nbytes, ready_s) == want
        else:  # the simulator never waits on model traffic itself, only KV yields to it
            sim.preempt(nbytes, ready_s)
        assert sim.free_at_s == state[0]
    assert state[0] >= state[1]


def test_ctl_overtakes_kv_backlog() -> None:
    state = [0.0, 0.0]
    assert book(state, 0.0, 5.0, "kv") == 5.0
    assert book(state, 1.0, 0.1, "ctl") == pytest.approx(1.1)  # not behind the KV backlog
    assert book(state, 1.0, 1.0, "kv") == pytest.approx(6.1)  # KV pays for the ctl bytes


@pytest.mark.parametrize("directions", ["shared", "duplex"])
def test_snic_directions_mean_the_same_in_both_drivers(directions: str) -> None:
    node = Node(0, "pe", RATE, 1e12, 0.0, snic_directions=directions)
    traffic = TrafficManager(
        engine_id=0, node_id=0, snic_gbps=8e-6, cnic_gbps=None, shared_dir=None, snic_directions=directions
    )  # 8e-6 Gbit/s = 1000 B/s
    try:
        assert (node.snic_tx is node.snic) == (directions == "shared")
        assert (traffic.snic_tx is traffic.snic) == (directions == "shared")
        transfer([node.snic_tx], 500, 0.0)  # a persist
        traffic.snic_tx.reserve(500, "kv", now=0.0)
        read_sim = transfer([node.snic], 500, 0.0)
        read_nic = traffic.snic.reserve(500, "kv", now=0.0)
        assert read_sim == pytest.approx(read_nic)
        assert read_sim == pytest.approx(1.0 if directions == "shared" else 0.5)
    finally:
        traffic.close()
