"""``dualpath demo``: one local 1P2D cluster, the same agents under Basic, DualPath and Oracle.

The cluster starts once (model loading dominates start-up on small machines); between systems it is
reconfigured (policy, Oracle's free reads) while idle, and each system's agents use fresh random
tokens (same lengths), so no system hits another's KV blocks. Storage NICs are capped so KV loading
binds; Oracle still computes everything but pays nothing for storage reads and PD transfers.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable

import msgspec

from dualpath.runtime.cluster.agents import AgentPlan, run_system
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.cluster.config import (
    DEMO_SYSTEMS as SYSTEMS,
)
from dualpath.runtime.cluster.config import (
    ClusterConfig,
    DemoConfig,
    SchedulerServiceConfig,
    TrafficConfig,
)
from dualpath.runtime.cluster.local import LocalCluster


def run_demo(
    cfg: DemoConfig,
    turns: list[tuple[str, tuple[tuple[int, int], ...]]],
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """Start the cluster, run every system with the agents ``turns`` (``(agent id, ((append_len,
    gen_len), ...))``, e.g. ``bench.agents.scaled_turns`` of cfg's sizes), return {"config",
    "systems": {name: row}, "ratios"}."""
    say = progress or (lambda _msg: None)
    kv_dir = cfg.kv_dir or tempfile.mkdtemp(prefix="dualpath-demo-kv-")
    agents = [AgentPlan(agent_id=agent_id, turns=t) for agent_id, t in turns]
    try:
        return _run(cfg, agents, kv_dir, say)
    finally:
        if not cfg.kv_dir:
            shutil.rmtree(kv_dir, ignore_errors=True)


def _run(
    cfg: DemoConfig, agents: list[AgentPlan], kv_dir: str, say: Callable[[str], None]
) -> dict[str, object]:
    ccfg = ClusterConfig(
        kv_dir=kv_dir,
        model=cfg.model,
        num_prefill_engines=cfg.num_prefill_engines,
        num_decode_engines=cfg.num_decode_engines,
        transport=cfg.transport,
        traffic=TrafficConfig(snic_gbps=cfg.snic, cnic_gbps=cfg.cnic_gbps),
        scheduler=SchedulerServiceConfig(engine_timeout_s=30.0),
    )
    say(f"starting {cfg.num_prefill_engines}P{cfg.num_decode_engines}D cluster ({cfg.model})")
    rows: dict[str, dict[str, object]] = {}
    with LocalCluster(ccfg) as cluster:

        async def main() -> None:
            async with ClusterClient(cluster.address, query_timeout_s=30.0) as client:
                for i, name in enumerate(cfg.systems):
                    say(f"running {name}: {len(agents)} agents, {sum(len(a.turns) for a in agents)} turns")
                    policy, free = SYSTEMS[name]
                    rows[name] = await run_system(
                        client,
                        agents,
                        policy=policy,
                        read_free=free,
                        seed=cfg.seed * 100 + i + 1,
                        settle_s=0.5,
                    )

        asyncio.run(main())
    return {
        "config": msgspec.to_builtins(cfg) | {"snic_gbps": cfg.snic},
        "systems": rows,
        "ratios": ratios(rows),
    }


def ratios(rows: dict[str, dict[str, object]]) -> dict[str, float]:
    """JCT ratios: basic/dualpath (speedup; ideal 3x at 1P2D when reads bind) and dualpath/oracle."""
    jct = {k: float(v["jct_s"]) for k, v in rows.items()}  # type: ignore[arg-type]
    out = {}
    if "basic" in jct and "dualpath" in jct:
        out["dualpath_speedup_over_basic"] = jct["basic"] / jct["dualpath"]
    if "oracle" in jct and "dualpath" in jct:
        out["dualpath_jct_over_oracle"] = jct["dualpath"] / jct["oracle"]
    return out
