"""``dualpath demo``'s measurement on a real local 1P2D cluster (tiny model, slow): the systems'
rounds interleave (the policy switched before each), every byte counter is a non-negative sum of
the rounds, and a system whose requests fail (here Oracle's, given a 10 ms request timeout) makes
the comparison say so first and print no JCT ratio (issue 31: "speedup 1.79x" over 33 vs 24
finished requests)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from rich.console import Console

from dualpath.bench.compare import compare
from dualpath.bench.systems import measure_interleaved
from dualpath.cli.demo import bench_config
from dualpath.cli.demo_tables import print_demo
from dualpath.runtime.cluster.config import DemoConfig
from dualpath.runtime.cluster.demo import served_demo_cluster


@pytest.mark.slow
def test_interleaved_systems_on_a_real_cluster_and_an_honest_report() -> None:
    cfg = DemoConfig(model="tiny", num_agents=2, max_turns=3)
    switched: list[str] = []
    with served_demo_cluster(cfg) as served:
        benches = {name: bench_config(cfg, served.url, i) for i, name in enumerate(cfg.systems)}
        benches["oracle"] = replace(benches["oracle"], request_timeout_s=0.01)

        async def switch(name: str) -> None:
            switched.append(name)
            await served.configure_async(name)
            health = await asyncio.to_thread(served.cluster.health)
            assert health is not None and health.policy == ("basic" if name == "basic" else "dualpath")

        out = asyncio.run(measure_interleaved(benches, switch, settle_s=0.5))
    assert switched[:3] == ["basic", "dualpath", "oracle"]
    assert switched[3:6] == ["dualpath", "oracle", "basic"] or len(switched) == 3
    for name, (run, row) in out.items():
        assert all(v >= 0 for group in ("bytes_by_path", "snic_read_bytes") for v in row[group].values()), row
        if name != "oracle":
            assert row["errors"] == [] and row["num_requests"] == sum(len(a.turns) for a in run.agents)
    assert (
        out["basic"][1]["bytes_by_path"]["de-read"] == 0 and out["basic"][1]["snic_read_bytes"]["node0"] > 0
    )
    runs = {n: r for n, (r, _row) in out.items()}
    rows = {n: row for n, (_r, row) in out.items()}
    comp = compare(runs, rows)
    assert not comp.same_work and comp.ratios == {} and comp.common_requests == 0
    result = {"config": {}, "systems": rows, "ratios": comp.ratios, "comparison": comp.as_dict()}
    con = Console(record=True, width=200)
    print_demo(result, "tiny", cfg.snic, cfg.num_agents, out=con)
    text = con.export_text()
    assert text.index("NOT COMPARABLE: oracle") < text.index("Latency per system")
    assert "speedup over Basic (JCT" not in text and "no ratio at all" in text
