"""``dualpath simulate --cluster local --device profile:FILE`` and ``dualpath simulate profile``.

The local cluster (``sim/local.py``) is our own ``dualpath serve`` 1PnD cluster; its engines' step
times come from a profile of the real engine (``dualpath simulate profile --out FILE`` measures
one: ``runtime/engine/step_profile.py``, the serve extra). Its default workload is ``dualpath
demo``'s agents, built by the same code ``dualpath bench`` replays them with
(``bench.agents.build_agents``), so a simulated run and a measured one see the same turns.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dualpath.core.errors import ConfigError

if TYPE_CHECKING:
    from dualpath.cli.sim_options import SimulateOptions
    from dualpath.sim.local import LocalClusterSpec
    from dualpath.spec.engine_profile import EngineProfile

DEVICE_FORMS = "profile:FILE (a measured engine profile: `dualpath simulate profile --out FILE`)"


def parse_device(text: str) -> EngineProfile:
    """``--device profile:FILE`` -> the profile (ConfigError naming the value otherwise)."""
    from dualpath.spec.engine_profile import EngineProfile

    kind, sep, path = text.partition(":")
    if kind.strip().lower() != "profile" or not sep or not path.strip():
        raise ConfigError("device", text, f"expected {DEVICE_FORMS}")
    return EngineProfile.load(path.strip())


def local_trajectories(*, agents: int, max_turns: int, scale: float, max_len: int, seed: int) -> list:
    """``dualpath bench``'s agents dataset (as ``dualpath demo`` replays it), as trajectories."""
    from dualpath.bench.agents import build_agents
    from dualpath.bench.config import BenchConfig
    from dualpath.workload import Trajectory, Turn

    cfg = BenchConfig(
        url="http://local",
        dataset_name="agents",
        num_agents=agents,
        maxlen=max_len,
        max_turns=max_turns,
        length_scale=scale,
        seed=seed,
    )
    out = []
    for a in build_agents(cfg, max_len):
        turns = tuple(Turn(append_len=t.append_len, gen_len=t.gen_len) for t in a.turns)
        out.append(Trajectory(a.agent_id, turns, a.start_s, None))
    return out


def simulate_local(
    systems: list[str],
    spec: Any,
    profile: EngineProfile,
    trajectories: list,
    *,
    seed: int = 0,
    calibrate: list[str] | None = None,
    out: str | None = None,
) -> dict[str, dict]:
    """Each system on the local cluster ``spec`` (a ``sim.local.LocalClusterSpec``)."""
    from dualpath.sim.config import SimConfig, get_system
    from dualpath.sim.harness.runner import run_one
    from dualpath.sim.local import LOCAL_CALIBRATION

    cal = LOCAL_CALIBRATION.with_overrides(calibrate or [])
    results = {}
    for name in systems:
        cfg = SimConfig(
            system=get_system(name), cluster=spec, profile=profile, seed=seed, calibration=cal, out_dir=out
        )
        results[name] = run_one(cfg, trajectories)
    return results


def run_local_cli(opts: SimulateOptions) -> None:
    """``dualpath simulate --cluster local --device profile:FILE``: every system of ``opts`` on the
    local cluster, the demo's workload unless the options say otherwise."""
    from dualpath.cli._common import print_json
    from dualpath.cli.sim_tables import print_offline
    from dualpath.sim.config import get_system
    from dualpath.sim.local import parse_local

    if opts.cluster is None or not parse_local(opts.cluster):
        raise ConfigError("cluster", opts.cluster or "none", "choices: local (with --device profile:FILE)")
    if opts.device is None:
        raise ConfigError("device", "none", f"--cluster local needs {DEVICE_FORMS}")
    profile = parse_device(opts.device)
    systems = opts.systems
    for name in systems:
        get_system(name)
    spec, work = _local_spec(opts), _local_work(opts)
    started = time.perf_counter()
    trajs = local_trajectories(**work)
    runs = simulate_local(
        systems, spec, profile, trajs, seed=opts.seed, calibrate=opts.calibrate, out=opts.out
    )
    for res in runs.values():
        jct = res.get("jct_s") or 0.0
        res["requests_per_sim_s"] = res["num_requests"] / jct if jct > 0 else None
    result = {
        "cluster": spec.name,
        "pd": spec.pd_label,
        "snic_gbps": spec.snic_gbps,
        "cnic_gbps": spec.cnic_gbps,
        "snic_directions": spec.snic_directions,
        "profile": {"model": profile.model, "host": profile.host, "created": profile.created},
        "workload": work,
        "agents": len(trajs),
        "systems": runs,
        "wall_s": time.perf_counter() - started,
    }
    if opts.json_out:
        print_json(result)
        return
    print_offline(result, profile.model, spec.pd_label, str(work["max_len"]))


def _local_spec(opts: SimulateOptions) -> LocalClusterSpec:
    """The local cluster of ``opts``: --pd engines (default 1p2d), the demo's SNIC rate, duplex
    SNICs unless --snic-directions names another model than the paper cluster's default."""
    from dualpath.cli.sim_options import DEFAULT_SNIC_DIRECTIONS
    from dualpath.sim import local
    from dualpath.spec.clusters import parse_pd

    p, d = parse_pd(opts.pd) if opts.pd else (1, 2)
    asked = opts.snic_directions if opts.snic_directions != DEFAULT_SNIC_DIRECTIONS else None
    return local.LocalClusterSpec(
        num_prefill_engines=p,
        num_decode_engines=d,
        snic_gbps=opts.snic_gbps if opts.snic_gbps is not None else local.DEMO_SNIC_GBPS,
        cnic_gbps=opts.cnic_gbps,
        snic_directions=asked or "duplex",
    )


def _local_work(opts: SimulateOptions) -> dict[str, Any]:
    """The demo's workload (``local.DEMO_*``), with --agents, --max-turns and a non-default
    --append-scale (the scale of every append and generation) in its place."""
    from dualpath.cli.sim_options import WORKLOAD
    from dualpath.sim import local

    scale = opts.append_scale if opts.append_scale != WORKLOAD.append_scale else None
    return {
        "agents": opts.agents or local.DEMO_AGENTS,
        "max_turns": opts.max_turns or local.DEMO_TURNS,
        "scale": scale or local.DEMO_SCALE,
        "max_len": local.DEMO_MAX_LEN,
        "seed": opts.seed,
    }


def run_profile_cli(*, out: str, model: str, quick: bool, json_out: bool) -> None:
    """Profile the real engine (the serve extra) and write the profile to ``out``."""
    from rich.console import Console

    from dualpath.cli._common import print_json, require_serve_extra

    require_serve_extra("simulate profile")
    from dualpath.runtime.engine.step_profile import load_for_profile, profile_engine

    err = Console(stderr=True)
    decoder, name = load_for_profile(model)
    kw = QUICK_GRID if quick else {}
    started = time.perf_counter()
    profile = profile_engine(decoder, model=name, progress=lambda m: err.print(f"[dim]profile: {m}"), **kw)
    profile.save(out)
    summary = {
        "out": out,
        "model": profile.model,
        "prefill_points": len(profile.prefill),
        "decode_points": len(profile.decode),
        "wall_s": time.perf_counter() - started,
    }
    if json_out:
        print_json(summary)
    else:
        err.print(
            f"wrote {out}: {summary['prefill_points']} prefill and {summary['decode_points']} "
            f"decode points of {profile.model} in {summary['wall_s']:.0f} s"
        )


# ``--quick``: a coarse grid (a smoke check, not a profile to compare a cluster against)
QUICK_GRID: dict[str, Any] = {
    "cached_lens": (0, 256),
    "new_lens": (1, 16, 64, 512),
    "batches": (1, 4),
    "contexts": (64, 1024),
    "join_lens": (64, 1024),
    "repeats": 1,
}
