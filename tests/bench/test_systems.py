"""The pieces ``dualpath demo`` measures systems with: explicit length scale, token seed, the
server's labelled counters as per-run deltas, a system's row (over the in-process fake cluster)."""

from __future__ import annotations

import asyncio

import pytest

from dualpath.bench import BenchConfig
from dualpath.bench.agents import TokenSource, build_agents
from dualpath.bench.server_metrics import by_label, parse_counters, parse_series
from dualpath.bench.systems import counter_deltas, measure_system, ratios
from dualpath.core.errors import ConfigError
from dualpath.workload import generate_trajectories, scale_turns, truncate


def test_length_scale_replays_the_scaled_32k_trajectories() -> None:
    """The demo's agents: 32K trajectories, every append and generation x scale, cut at max_len
    tokens and max_turns turns (what the runtime's own replay client used to build)."""
    cfg = BenchConfig(num_agents=6, maxlen=2048, max_turns=6, length_scale=1 / 16, seed=3)
    agents = build_agents(cfg, context_len=8192)
    want = []
    for t in generate_trajectories("32k", 6, seed=3):
        t = truncate(scale_turns(t, 1 / 16, 1 / 16), 2048)
        want.append((t.traj_id, tuple((x.append_len, x.gen_len) for x in t.turns[:6])))
    got = [(a.agent_id, tuple((t.append_len, t.gen_len) for t in a.turns)) for a in agents]
    assert got == want
    half = build_agents(
        BenchConfig(num_agents=6, maxlen=2048, max_turns=6, length_scale=1 / 32, seed=3), 8192
    )
    assert sum(t.append_len for a in half for t in a.turns) < sum(
        t.append_len for a in agents for t in a.turns
    )


def test_token_seed_changes_tokens_not_lengths() -> None:
    a = BenchConfig(num_agents=2, maxlen=1024, seed=1)
    b = BenchConfig(num_agents=2, maxlen=1024, seed=1, token_seed=7)
    assert build_agents(a, 4096) == build_agents(b, 4096)
    assert TokenSource(a, 0, 512).take(50) != TokenSource(b, 0, 512).take(50)
    assert TokenSource(b, 0, 512).take(50) == TokenSource(BenchConfig(seed=9, token_seed=7), 0, 512).take(50)


@pytest.mark.parametrize(
    "kw",
    [
        {"length_scale": 0.0},
        {"length_scale": 1.5},
        {"length_scale": 0.5, "trace": "x.jsonl"},
        {"token_seed": -1},
    ],
)
def test_bad_scale_or_token_seed(kw) -> None:
    with pytest.raises(ConfigError):
        BenchConfig(**kw)


def test_labelled_counters_and_deltas() -> None:
    before = parse_series(
        '# TYPE dualpath_kv_bytes counter\ndualpath_kv_bytes_total{path="pe-read"} 100\n'
        'dualpath_nic_bytes_total{nic="node0/snic:read"} 5\n'
        'dualpath_requests_by_read_side_total{side="pe"} 1.0\n'
    )
    after = parse_series(
        'dualpath_kv_bytes_total{path="pe-read"} 350\ndualpath_kv_bytes_total{path="de-read"} 40\n'
        'dualpath_nic_bytes_total{nic="node0/snic:read"} 9\n'
        'dualpath_nic_bytes_total{nic="node1/snic:read",x="a,b \\"q\\""} 2\n'
        'dualpath_requests_by_read_side_total{side="pe"} 3.0\n'
    )
    assert by_label(after, "dualpath_nic_bytes_total", "x") == {'a,b "q"': 2.0}
    assert parse_counters('a_total{k="1"} 2\na_total{k="2"} 3\nb 1 1700000000\n') == {
        "a_total": 5.0,
        "b": 1.0,
    }
    d = counter_deltas(before, after)
    assert d["bytes_by_path"] == {"de-read": 40, "pe-read": 250}
    assert d["bytes_by_nic"] == {"node0/snic:read": 4, "node1/snic:read": 2}
    assert d["read_sides"] == {"pe": 2}


def test_measure_system_row_over_the_api(fake_server) -> None:
    url, _fake = fake_server
    cfg = BenchConfig(url=url, num_agents=2, maxlen=512, max_turns=2, length_scale=1 / 64)
    run, row = asyncio.run(measure_system(cfg, settle_s=0.0))
    assert row["num_requests"] == len(run.results) == sum(len(a.turns) for a in run.agents) > 0
    assert row["errors"] == [] and row["jct_s"] == run.wall_s > 0
    assert row["generated_tokens"] == sum(t.gen_len for a in run.agents for t in a.turns)
    assert row["ttft_mean_s"] is not None and row["ttft_p90_s"] >= min(r.ttft_s for r in run.results)
    assert ratios({"basic": {"jct_s": 6.0}, "dualpath": {"jct_s": 2.0}, "oracle": {"jct_s": 1.0}}) == {
        "dualpath_speedup_over_basic": 3.0,
        "dualpath_jct_over_oracle": 2.0,
    }
