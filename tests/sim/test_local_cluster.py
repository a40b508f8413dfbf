"""The local cluster (sim/local.py, ``dualpath simulate --cluster local --device profile:FILE``): its
spec is the runtime's own defaults, and a simulated run follows the runtime's order (engines take
tasks between steps, persists gate a request's last token, Oracle pays persists)."""

from __future__ import annotations

import csv
import json

import pytest
from tests.cost.test_engine_profile import make_profile
from typer.testing import CliRunner

from dualpath.core.errors import ConfigError
from dualpath.core.units import gbps_to_bytes_per_s
from dualpath.sim import local
from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.driver import Simulation
from dualpath.sim.harness.runner import make_agents, run_one
from dualpath.sim.local import LOCAL_CALIBRATION, LocalClusterSpec


def _trajs():
    from dualpath.cli.sim_local import local_trajectories

    return local_trajectories(agents=6, max_turns=6, scale=1 / 16, max_len=2048, seed=0)


def _run(
    system: str, snic_gbps: float = 0.1, out: str | None = None, cores: float | None = None, bg: float = 0.0
) -> dict:
    cfg = SimConfig(
        system=get_system(system),
        cluster=LocalClusterSpec(snic_gbps=snic_gbps, cpu_cores=cores, background_threads=bg),
        profile=make_profile(),
        calibration=LOCAL_CALIBRATION,
        out_dir=out,
    )
    return run_one(cfg, _trajs())


def test_the_spec_is_the_runtimes_defaults() -> None:
    pytest.importorskip("torch")
    from dualpath.runtime.cluster.config import (
        DEMO_SNIC_GBPS,
        PREFILL_TOKENS_PER_S_OTHER,
        DemoConfig,
        EngineConfig,
        SchedulerServiceConfig,
        TrafficConfig,
    )

    engine, demo = EngineConfig(), DemoConfig()
    assert local.FETCH_TICK_S == SchedulerServiceConfig().tick_s
    assert local.BLOCK_SIZE == engine.block_size
    assert engine.kv_cache_memory == "auto"  # what LocalClusterSpec(kv_cache_bytes=None) sizes by
    assert local.COMPUTE_QUOTA_S == engine.compute_quota_s
    assert local.MAX_BATCH_TOKENS == engine.max_batch_tokens
    assert local.PREFILL_TOKENS_PER_S == PREFILL_TOKENS_PER_S_OTHER
    assert LocalClusterSpec().snic_directions == TrafficConfig().snic_directions
    assert (local.DEMO_AGENTS, local.DEMO_TURNS, local.DEMO_SCALE, local.DEMO_MAX_LEN) == (
        demo.num_agents,
        demo.max_turns,
        demo.scale,
        demo.max_len,
    )
    assert local.DEMO_SNIC_GBPS == DEMO_SNIC_GBPS[demo.model]
    assert (LocalClusterSpec().num_prefill_engines, LocalClusterSpec().num_decode_engines) == (
        demo.num_prefill_engines,
        demo.num_decode_engines,
    )


# (layers, KV heads, head dim, dtype, max context): SmolLM2-135M in float32 (auto: the byte cap
# binds), a tiny model (the token cap binds) and one whose context exceeds the PE's staging share
MODELS = [(30, 3, 64, "float32", 8192), (2, 1, 16, "float32", 2048), (4, 2, 64, "bfloat16", 131072)]


@pytest.mark.parametrize("layers,heads,dim,dtype,ctx", MODELS)
@pytest.mark.parametrize("memory_spec,budget", [("auto", None), ("96MiB", 96 << 20)])
def test_the_kv_pools_are_the_runtimes(layers, heads, dim, dtype, ctx, memory_spec, budget) -> None:
    """Each engine's pools as the runtime sizes them from ``--kv-cache-memory`` for the model
    (``engine_setup.engine_pools``), from the profile of that model."""
    torch = pytest.importorskip("torch")
    from dualpath.runtime.cluster.engine_setup import engine_pools
    from dualpath.runtime.cluster.kvio import Geometry

    geo = Geometry(
        num_layers=layers, num_kv_heads=heads, head_dim=dim, dtype=getattr(torch, dtype), block_size=64
    )
    bpt = geo.layout().kv_bytes_per_token
    profile = make_profile(num_layers=layers, kv_bytes_per_token=bpt, max_context_len=ctx)
    pe, de = LocalClusterSpec(kv_cache_bytes=budget).kv_pools(profile)
    assert pe == engine_pools("prefill", memory_spec, geo, ctx)
    assert de == engine_pools("decode", memory_spec, geo, ctx)


def test_the_simulated_engines_use_their_pools() -> None:
    # SmolLM2-135M (float32) under auto: a 1 GiB budget, half a DE's for its buffer; the DE's
    # paged cache (what the scheduler books it for) holds far fewer than the old 65,536 tokens
    profile = make_profile(max_context_len=8192)
    spec = LocalClusterSpec()
    pe, de = spec.kv_pools(profile)
    assert pe.budget_bytes == de.budget_bytes == 1 << 30
    assert de.cache_blocks == de.buffer_blocks == (1 << 29) // (64 * 46_080)
    assert 8192 <= de.max_context_tokens < 16_384
    assert pe.staging_tokens == (1 << 27) // (2 * 1536)  # 1/8 of the budget, two slots of a layer
    sim = Simulation(
        SimConfig(
            system=get_system("dualpath"), cluster=spec, profile=profile, calibration=LOCAL_CALIBRATION
        ),
        make_agents(_trajs()),
    )
    assert sim.max_de_tokens == de.max_context_tokens
    assert all(st.hbm_tokens == de.max_context_tokens for st in sim.de_list)
    assert sim.adapter.plan_limits.staging_tokens == pe.staging_tokens
    assert [n.buffer_bytes for n in sim.cluster.nodes] == [pe.buffer_bytes, de.buffer_bytes, de.buffer_bytes]
    # a smaller budget: smaller pools, the same rule
    small = LocalClusterSpec(kv_cache_bytes=64 << 20).kv_pools(profile)[1]
    assert small.max_context_tokens < de.max_context_tokens
    with pytest.raises(ConfigError, match="kv_cache_bytes"):
        LocalClusterSpec(kv_cache_bytes=0)
    # a turn longer than the DE's paged cache is refused, as the runtime refuses it, naming why
    tight = SimConfig(
        system=get_system("dualpath"),
        cluster=LocalClusterSpec(kv_cache_bytes=64 << 20),
        profile=profile,
        calibration=LOCAL_CALIBRATION,
    )
    with pytest.raises(Exception, match="paged cache"):
        run_one(tight, _trajs())


def test_the_local_cluster_is_built_as_the_runtime_runs_it() -> None:
    spec, profile = LocalClusterSpec(snic_gbps=0.2, cnic_gbps=None), make_profile()
    sim = Simulation(
        SimConfig(system=get_system("basic"), cluster=spec, profile=profile, calibration=LOCAL_CALIBRATION),
        make_agents(_trajs()),
    )
    pe, de = spec.kv_pools(profile)
    assert [n.role for n in sim.cluster.nodes] == ["pe", "de", "de"]
    assert [len(n.gpus) for n in sim.cluster.nodes] == [1, 1, 1]
    assert all(n.snic.bytes_per_s == gbps_to_bytes_per_s(0.2) for n in sim.cluster.nodes)
    assert all(n.snic_tx is not n.snic for n in sim.cluster.nodes)  # persists on the other direction
    assert sim.cluster.nodes[0].buffer_bytes == pe.buffer_bytes
    assert sim.cluster.nodes[1].buffer_bytes == de.buffer_bytes
    assert all(g.tx.bytes_per_s == float("inf") for g in sim.cluster.gpus)  # uncapped CNICs
    order = sim.adapter.fetcher.order
    assert (order.interval_s, order.route_round_robin, order.dirty_only, order.rotate_pe) == (
        0.002,
        False,
        False,
        False,
    )
    assert not order.pe_fetch_at_boundary
    assert type(sim.load).__name__ == "LayerwiseLoad"  # Basic runs the runtime's layerwise engine
    assert sim.adapter.plan_limits.staging_tokens == pe.staging_tokens
    assert sim.adapter.batch_limits.hbm_tokens is None and sim.adapter.batch_limits.max_items is None
    assert sim.max_de_tokens == de.max_context_tokens
    cfg = sim.adapter.scheduler.config
    assert cfg.alpha_tokens == int(3 * gbps_to_bytes_per_s(0.2) / profile.kv_bytes_per_token)
    assert cfg.max_batch_tokens == local.MAX_BATCH_TOKENS


def test_bytes_follow_the_read_paths_and_oracle_pays_persists_only() -> None:
    basic, dualpath, oracle = _run("basic"), _run("dualpath"), _run("oracle")
    assert basic["snic_read_bytes_by_node"][1:] == [0.0, 0.0]  # Basic: the PE node reads
    assert dualpath["snic_read_bytes_by_node"][1] > 0 and dualpath["snic_read_bytes_by_node"][2] > 0
    assert sum(basic["snic_read_bytes_by_node"]) == pytest.approx(sum(dualpath["snic_read_bytes_by_node"]))
    assert oracle["snic_read_bytes_by_node"] == [0.0, 0.0, 0.0]
    assert oracle["bytes"]["de_snic_write"] == basic["bytes"]["de_snic_write"] > 0
    assert not any(v for k, v in oracle["bytes"].items() if "cnic" in k)
    assert basic["jct_s"] > dualpath["jct_s"] > oracle["jct_s"]


def test_persists_gate_the_last_token() -> None:
    # Oracle reads nothing, so only its persists see the storage NIC: a slower SNIC, a later JCT
    fast, slow = _run("oracle", snic_gbps=10.0), _run("oracle", snic_gbps=0.05)
    persist_s = slow["bytes"]["de_snic_write"] / 2 / gbps_to_bytes_per_s(0.05)  # two DE nodes
    assert slow["jct_s"] > fast["jct_s"] + 0.5 * persist_s


def test_engines_take_tasks_between_steps_and_the_client_gets_token_one_with_token_two(tmp_path) -> None:
    _run("dualpath", out=str(tmp_path))
    with open(tmp_path / "requests_dualpath.csv", encoding="utf-8") as fh:
        rows = [{k: float(v) if k.startswith("t_") else v for k, v in r.items()} for r in csv.DictReader(fh)]
    assert len(rows) == 36
    # a task reaching a computing PE waits for its step to end before its reads start
    assert any(r["t_alloc"] > r["t_pe"] + 0.01 for r in rows)
    assert all(r["t_alloc"] >= r["t_pe"] - 1e-12 for r in rows)
    # the first token leaves with the second, at the end of the DE's first step with the request
    assert all(r["t_first"] > r["t_join"] for r in rows if int(r["gen_len"]) > 1)


def test_engines_share_the_machines_cores() -> None:
    # Oracle computes most of the time: with one core for three engines it takes longer; with a
    # core each (or more) nobody waits for a core
    one, two, three, four = (_run("oracle", cores=c)["jct_s"] for c in (1, 2, 3, 4))
    assert one > two > three == four
    assert _run("oracle")["jct_s"] == two  # the profile's machine: 2 cores
    # other work on the machine: its runnable threads take their shares too
    assert _run("oracle", bg=1.0)["jct_s"] > two
    assert _run("oracle", cores=4, bg=1.0)["jct_s"] == four  # room for both


def test_the_local_cluster_and_a_profile_go_together() -> None:
    with pytest.raises(ConfigError, match="profile"):
        SimConfig(system=get_system("basic"), cluster=LocalClusterSpec(), calibration=LOCAL_CALIBRATION)
    from dualpath.spec.clusters import get_cluster

    with pytest.raises(ConfigError, match="--cluster local"):
        SimConfig(system=get_system("basic"), cluster=get_cluster("ds27b-1p1d"), profile=make_profile())
    with pytest.raises(ConfigError, match="snic_gbps"):
        LocalClusterSpec(snic_gbps=0.0)


def test_cli_runs_the_local_cluster_and_names_bad_values(tmp_path) -> None:
    from dualpath.cli import app

    path = tmp_path / "p.json"
    make_profile().save(path)
    runner = CliRunner()
    res = runner.invoke(app, ["simulate", "--cluster", "local", "--device", f"profile:{path}", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["pd"] == "1P2D" and set(out["systems"]) == {"basic", "dualpath", "oracle"}
    assert out["systems"]["basic"]["num_requests"] == 36
    bad = [
        (["simulate", "--cluster", "local"], "device"),
        (["simulate", "--device", f"profile:{path}"], "cluster"),
        (["simulate", "--cluster", "mars", "--device", f"profile:{path}"], "mars"),
        (["simulate", "--cluster", "local", "--device", "gpu:h100"], "gpu:h100"),
    ]
    for args, name in bad:
        res = runner.invoke(app, args)
        assert res.exit_code != 0 and name in str(res.exception), (args, res.output)
