"""``dualpath demo``'s run: one local 1P2D ``dualpath serve`` cluster, each system measured with
``dualpath bench`` over HTTP.

The cluster starts once (model loading dominates start-up on small machines) behind the HTTP API
on a loopback port (``runtime.cluster.demo.ServedCluster``). Every system replays the same agents
(``BenchConfig``: the synthetic 32K trajectories scaled by ``scale``, cut at ``max_turns`` turns
and ``max_len`` tokens) with a fresh token seed per system, so no system hits another's KV blocks;
the systems' rounds are interleaved (``bench.systems.measure_interleaved``: turn ``k`` of every
agent under each system in turn, the cluster reconfigured while idle before each), so a load change
during the demo falls on all of them alike. ``bench.compare`` then says whether they did the same
work before any ratio. What each
system measures is what ``dualpath bench`` with ``bench_args`` measures against ``dualpath serve
--policy <policy>`` (whose server gives up on a request after 120 s without a token; the demo's
waits ``REQUEST_TIMEOUT_S``, as a slow CPU needs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec

from dualpath.bench.compare import compare
from dualpath.bench.config import BenchConfig
from dualpath.bench.systems import measure_interleaved
from dualpath.runtime.cluster.config import DemoConfig

REQUEST_TIMEOUT_S = 900.0  # one request (a Basic turn waits behind the one storage NIC)
RUN_LIMIT_S = 3600.0  # one system's run
# the server's waits: a first token may come minutes late on a loaded CPU (serve's default 120 s
# failed Basic's turns at load average 30), the scheduler may answer /metrics late
SERVER_QUERY_TIMEOUT_S = 30.0


def bench_config(cfg: DemoConfig, url: str, index: int) -> BenchConfig:
    """The ``dualpath bench`` run of the ``index``-th system: the demo's agents, all at once,
    with token seed ``seed * 100 + index + 1`` (same lengths, fresh tokens per system)."""
    return BenchConfig(
        url=url,
        dataset_name="agents",
        num_agents=cfg.num_agents,
        maxlen=cfg.max_len,
        max_turns=cfg.max_turns,
        length_scale=cfg.scale,
        seed=cfg.seed,
        token_seed=cfg.seed * 100 + index + 1,
        request_timeout_s=REQUEST_TIMEOUT_S,
        duration_s=RUN_LIMIT_S,
    )


def bench_args(bench: BenchConfig) -> str:
    """The ``dualpath bench`` flags that replay ``bench`` (the server's URL aside)."""
    return (
        f"--agents {bench.num_agents} --maxlen {bench.maxlen} --max-turns {bench.max_turns} "
        f"--scale {bench.length_scale:g} --seed {bench.seed} --token-seed {bench.token_seed}"
    )


def run_demo(cfg: DemoConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Start the cluster, measure every system of ``cfg`` with their rounds interleaved
    (``bench.systems.measure_interleaved``); {"config", "systems": {name: row of
    ``bench.systems.system_row`` + "bench_args"}, "ratios", "comparison"} (``bench.compare``:
    ``ratios`` is empty when the systems did different work). ``progress`` hears "starting ..."
    once, then "round <k> of <n>: <system>" per system and round."""
    from dualpath.runtime.cluster.demo import served_demo_cluster
    from dualpath.runtime.server.config import ServerConfig

    say = progress or (lambda _msg: None)
    say(f"starting {cfg.num_prefill_engines}P{cfg.num_decode_engines}D cluster ({cfg.model})")
    server = ServerConfig(token_timeout_s=REQUEST_TIMEOUT_S, cluster_query_timeout_s=SERVER_QUERY_TIMEOUT_S)
    with served_demo_cluster(cfg, server) as served:
        benches = {name: bench_config(cfg, served.url, i) for i, name in enumerate(cfg.systems)}
        rounds = [0]

        async def switch(name: str) -> None:
            rounds[0] += 1
            say(f"round {(rounds[0] - 1) // len(benches) + 1} of at most {cfg.max_turns}: {name}")
            await served.configure_async(name)

        measured = asyncio.run(measure_interleaved(benches, switch, settle_s=0.5))
    rows = {name: row | {"bench_args": bench_args(benches[name])} for name, (_run, row) in measured.items()}
    comparison = compare({name: run for name, (run, _row) in measured.items()}, rows)
    return {
        "config": msgspec.to_builtins(cfg) | {"snic_gbps": cfg.snic},
        "systems": rows,
        "ratios": comparison.ratios,
        "comparison": comparison.as_dict(),
    }
