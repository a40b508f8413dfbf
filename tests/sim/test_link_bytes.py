"""Bytes per link class follow the data paths of spec section 4 (the terms of section 6)."""

from __future__ import annotations

import pytest

from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.driver import Simulation
from dualpath.sim.harness.runner import make_agents


def _run(system: str, make_cluster, make_trajectories):
    trajs = make_trajectories(30, turns=5, first=2048, append=300, gen=20)
    sim = Simulation(SimConfig(system=get_system(system), cluster=make_cluster(1, 1)), make_agents(trajs))
    result = sim.run()
    prompt = sum(
        sum(t.append_len for t in tr.turns[: i + 1]) + sum(t.gen_len for t in tr.turns[:i])
        for tr in trajs
        for i in range(len(tr.turns))
    )
    return sim, result["bytes"], sim.metrics.hit_tokens * sim.bpt, prompt * sim.bpt


def test_basic_pe_path_bytes(make_cluster, make_trajectories) -> None:
    sim, b, hit, prompt = _run("basic", make_cluster, make_trajectories)
    assert b["pe_snic_read"] == pytest.approx(hit) and b["de_snic_read"] == 0
    assert b["pe_cnic_rx"] == pytest.approx(hit)  # (3)(4) loopback into PE HBM
    assert b["pe_cnic_tx"] == pytest.approx(hit + prompt)  # loopback + (5)-(7) hit+miss out
    assert b["de_cnic_rx"] == pytest.approx(2 * prompt)  # (5)-(7) in + (8)(9) loopback
    assert b["de_cnic_tx"] == pytest.approx(prompt)  # (8)(9) loopback out of DRAM


def test_de_reads_go_over_the_de_cnic(make_cluster, make_trajectories) -> None:
    sim, b, hit, prompt = _run("dualpath", make_cluster, make_trajectories)
    de_hit = b["de_snic_read"]
    pe_hit = b["pe_snic_read"]
    assert de_hit + pe_hit == pytest.approx(hit)
    assert de_hit > 0
    # DE CNIC tx: DE-read hits sent to the PE (DE path 3-5) + the buffer -> HBM copy of every prompt
    assert b["de_cnic_tx"] == pytest.approx(de_hit + prompt, rel=1e-9)
    assert b["pe_cnic_rx"] == pytest.approx(hit, rel=1e-9)  # every hit arrives in PE HBM once


def test_oracle_moves_nothing(make_cluster, make_trajectories) -> None:
    _sim, b, _hit, _prompt = _run("oracle", make_cluster, make_trajectories)
    assert all(v == 0 for k, v in b.items() if k != "model_cnic")


def test_decode_steps_put_ep_all_to_all_on_de_cnics(make_cluster, make_trajectories) -> None:
    """Each decode step sends every running request's token through the MoE all-to-all: over a
    run, a DE GPU's CNIC carries (gen_len - 1) x per-token bytes per request in each direction
    (high-priority lane, counted as model bytes). Oracle skips link costs altogether."""
    trajs = make_trajectories(24, turns=4, first=2048, append=300, gen=20)
    sim = Simulation(SimConfig(system=get_system("dualpath"), cluster=make_cluster(1, 4)), make_agents(trajs))
    b = sim.run()["bytes"]
    per_token = sim.costs.de_model_bytes(1)
    assert per_token > 0  # a 4-node DE EP group: tokens cross node boundaries
    steps = sum(t.gen_len - 1 for tr in trajs for t in tr.turns)
    assert b["de_model_cnic"] == pytest.approx(2 * steps * per_token, rel=1e-9)
    assert b["model_cnic"] == pytest.approx(b["de_model_cnic"] + b["pe_model_cnic"], rel=1e-12)
    oracle = Simulation(
        SimConfig(system=get_system("oracle"), cluster=make_cluster(1, 4)), make_agents(trajs)
    ).run()["bytes"]
    assert oracle["de_model_cnic"] == 0
