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

from dualpath.core.errors import require
from dualpath.runtime.cluster.agents import AgentPlan, run_system
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.cluster.config import ClusterConfig
from dualpath.runtime.cluster.local import LocalCluster

SYSTEMS: dict[str, tuple[str, bool]] = {  # name -> (policy, read_free)
    "basic": ("basic", False),
    "dualpath": ("dualpath", False),
    "oracle": ("dualpath", True),
    "rr-shorter-queue": ("rr-shorter-queue", False),
    "always-de": ("always-de", False),
    "dualpath-split": ("dualpath-split", False),
}
# Default storage-NIC caps (Gbit/s) per model so that reading a turn's cached context takes a few
# times longer than computing its append on a 2-core CPU (KV: SmolLM2 46 KB/token fp32, tiny 2 KB).
DEFAULT_SNIC_GBPS = {"smollm2-135m": 0.1, "tiny": 0.01}


class DemoConfig(msgspec.Struct, frozen=True, kw_only=True):
    model: str = "smollm2-135m"
    systems: tuple[str, ...] = ("basic", "dualpath", "oracle")
    num_prefill_engines: int = 1
    num_decode_engines: int = 2
    num_agents: int = 6
    max_turns: int = 6
    scale: float = 1 / 16
    max_len: int = 2048
    snic_gbps: float | None = None  # None: DEFAULT_SNIC_GBPS[model]
    cnic_gbps: float | None = None
    transport: str = "zmq"
    kv_dir: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        for s in self.systems:
            require(s in SYSTEMS, "system", s, f"choices: {', '.join(SYSTEMS)}")
        require(self.num_agents >= 1, "num_agents", self.num_agents, "must be >= 1")
        require(self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        require(0 < self.scale <= 1, "scale", self.scale, "must be in (0, 1]")

    @property
    def snic(self) -> float:
        return self.snic_gbps if self.snic_gbps is not None else DEFAULT_SNIC_GBPS.get(self.model, 0.1)


def run_demo(cfg: DemoConfig, turns: list[tuple[str, tuple[tuple[int, int], ...]]],
             progress: Callable[[str], None] | None = None) -> dict[str, object]:
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


def _run(cfg: DemoConfig, agents: list[AgentPlan], kv_dir: str,
         say: Callable[[str], None]) -> dict[str, object]:
    ccfg = ClusterConfig(kv_dir=kv_dir, model=cfg.model, num_prefill_engines=cfg.num_prefill_engines,
                         num_decode_engines=cfg.num_decode_engines, snic_gbps=cfg.snic,
                         cnic_gbps=cfg.cnic_gbps, transport=cfg.transport, engine_timeout_s=30.0)
    say(f"starting {cfg.num_prefill_engines}P{cfg.num_decode_engines}D cluster ({cfg.model})")
    rows: dict[str, dict[str, object]] = {}
    with LocalCluster(ccfg) as cluster:
        async def main() -> None:
            async with ClusterClient(cluster.address, query_timeout_s=30.0) as client:
                for i, name in enumerate(cfg.systems):
                    say(f"running {name}: {len(agents)} agents, "
                        f"{sum(len(a.turns) for a in agents)} turns")
                    policy, free = SYSTEMS[name]
                    rows[name] = await run_system(client, agents, policy=policy, read_free=free,
                                                  seed=cfg.seed * 100 + i + 1, settle_s=0.5)

        asyncio.run(main())
    return {"config": msgspec.to_builtins(cfg) | {"snic_gbps": cfg.snic},
            "systems": rows, "ratios": ratios(rows)}


def ratios(rows: dict[str, dict[str, object]]) -> dict[str, float]:
    """JCT ratios: basic/dualpath (speedup; ideal 3x at 1P2D when reads bind) and dualpath/oracle."""
    jct = {k: float(v["jct_s"]) for k, v in rows.items()}  # type: ignore[arg-type]
    out = {}
    if "basic" in jct and "dualpath" in jct:
        out["dualpath_speedup_over_basic"] = jct["basic"] / jct["dualpath"]
    if "oracle" in jct and "dualpath" in jct:
        out["dualpath_jct_over_oracle"] = jct["dualpath"] / jct["oracle"]
    return out
