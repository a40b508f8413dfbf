"""``dualpath simulate fidelity``: every published point of spec section 10 the simulator can
produce, run and compared (simulated vs published, relative error).

The published numbers below are spec section 10's, nothing else (the paper's other figures are kept
out of the project as a fair test: docs/fidelity.md). A point names the run it comes from; the runs are
planned first (``plan_runs``) so progress can count them, then executed once each and shared by
the points that use them. A :class:`FidelityScale` shrinks the runs: ``quick`` divides every agent
count by 16, shortens the online horizon to 600 s, sweeps a coarse rate grid and puts the two
large-scale points on 8P16D / 4P8D (each point says whether and how it was scaled); ``tiny`` is
for tests. With a scaled run the error is that of the scaled setting against the published number
(it tells how far the small setting is from the paper, not the model's error at full scale).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dualpath.sim.calibration import Calibration

from dualpath.sim.harness.experiments import (
    WorkloadSpec,
    make_cluster,
    make_trajectories,
)
from dualpath.sim.harness.fidelity_points import (  # noqa: F401 (the published numbers, re-exported)
    ABLATION_AGENTS,
    AGENTS,
    DS27,
    DS660,
    NOT_SIMULATED,
    PUB_ABLATION_REDUCTION_PCT,
    PUB_ABLATION_S,
    PUB_ATTN_EARLY,
    PUB_CAPACITY_APS,
    PUB_CAPACITY_RATIO,
    PUB_HEADLINE,
    PUB_JCT_S,
    PUB_SCALE_JCT_S,
    PUB_SCALE_ONLINE,
    PUB_SNIC,
    SCALE_MAXLEN,
    SCALES,
    FidelityScale,
    _points,
    _units,
)


def plan_runs(scale: FidelityScale) -> list[tuple]:
    """Every run the points need, once each: ``("offline", model, pd, maxlen, agents, system)``,
    ``("sweep", model, pd, system)`` and ``("online", model, pd, system, aps)``."""
    runs: list[tuple] = []
    for n in AGENTS:
        systems = ["basic", "dualpath", "oracle"]
        if n in ABLATION_AGENTS:
            systems[1:1] = ["layerwise", "dualpath-rr-random"]
        runs += [("offline", DS660, "2p4d", 65536, scale.agents(n), s) for s in systems]
    runs += [
        ("sweep", m, pd, s) for m, pd in ((DS660, "2p4d"), (DS27, "1p1d")) for s in ("basic", "dualpath")
    ]
    runs.append(("offline", DS660, "2p4d", SCALE_MAXLEN, scale.agents(2048), "dualpath"))
    runs.append(
        (
            "offline",
            DS660,
            scale.large_pd,
            SCALE_MAXLEN,
            scale.agents(2048) * _units(scale.large_pd),
            "dualpath",
        )
    )
    runs.append(("online", DS660, "2p4d", "dualpath", 0.4))
    runs.append(
        ("online", DS660, scale.large_online_pd, "dualpath", round(0.4 * _units(scale.large_online_pd), 6))
    )
    return runs


def _execute(run: tuple, scale: FidelityScale, trajs: dict, kw: dict) -> dict:
    from dualpath.sim.harness.online import capacity_sweep, run_online
    from dualpath.sim.harness.runner import run_systems

    kind, model, pd = run[:3]
    if kind == "offline":
        maxlen, n, system = run[3:]
        key = (maxlen, n)
        if key not in trajs:
            trajs[key] = make_trajectories(WorkloadSpec(maxlen=maxlen, num_agents=n))
        return run_systems([system], make_cluster(model, pd), trajs[key], **kw)[system]
    if "base" not in trajs:
        trajs["base"] = make_trajectories(WorkloadSpec(num_agents=500))
    if kind == "sweep":
        rates = list(scale.rates_ds660 if model == DS660 else scale.rates_ds27)
        return capacity_sweep(
            run[3], make_cluster(model, pd), trajs["base"], rates, horizon_s=scale.horizon_s, **kw
        )
    return run_online(run[3], make_cluster(model, pd), trajs["base"], run[4], horizon_s=scale.horizon_s, **kw)


def _measured(res: dict, scale: FidelityScale) -> list[dict]:
    """What the runs measure that spec section 10 gives no number for (so no error): the TTFT
    breakdown in the paper's four categories (its figure 12; section 10 has no values) and the
    attention balance over the whole run next to the early one."""
    out: list[dict] = []
    n512 = scale.agents(512)
    for system in ("basic", "dualpath", "oracle"):
        r = res[("offline", DS660, "2p4d", 65536, n512, system)]
        out.append(
            {
                "what": f"ttft breakdown {system}, {n512} agents (offline 64K 2P4D)",
                "ttft_s": r["mean_ttft_s"],
                "ttft_breakdown_s": r["ttft_breakdown_s"],
            }
        )
    r = res[("online", DS660, "2p4d", "dualpath", 0.4)]
    bd = r["ttft_breakdown_s"]  # over every request of the run (warm-up included)
    out.append(
        {
            "what": "ttft breakdown dualpath 2P4D at 0.4 APS (online, warm-up included)",
            "ttft_s": sum(bd.values()),
            "ttft_breakdown_s": bd,
        }
    )
    r = res[("offline", DS660, "2p4d", 65536, n512, "dualpath")]
    out.append(
        {
            "what": (
                f"attn max/avg dualpath, {n512} agents: early (first 5% of requests; per-GPU totals, "
                "and the per-iteration mean over GPUs with a batch) and whole run (per iteration)"
            ),
            "early": r["attn_max_over_avg_early"],
            "early_per_iteration": r["attn_iter_max_over_avg_early"],
            "run": r["attn_max_over_avg"],
        }
    )
    return out


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def _summary(points: list[dict]) -> dict:
    """How many points have an error, its median and worst |value|, how many within 10%."""
    errors = [abs(p["rel_error"]) for p in points if p["rel_error"] is not None]
    return {
        "points": len(points),
        "with_error": len(errors),
        "median_abs_rel_error": _median(errors),
        "max_abs_rel_error": max(errors) if errors else None,
        "within_10pct": sum(e <= 0.10 for e in errors),
    }


def run_fidelity(
    scale: FidelityScale,
    progress: Callable[[str], None] | None = None,
    *,
    calibration: Calibration | None = None,
    pe_scope: str | None = None,
    read_tie: str = "pe",
    pe_tie: str = "group",
    pe_fetch: str = "boundary",
) -> dict:
    """Run every planned run and return ``{"scale", "points", "summary", "not_simulated", ...}``;
    ``progress(description)`` is called before each run. ``calibration`` / ``pe_scope`` / ``read_tie`` /
    ``pe_tie`` / ``pe_fetch`` replace the simulator's constants, the policies' PE scope, the
    scheduler's tie-breaks and the PE fetch cadence in every run (``SimConfig``'s fields)."""
    import time

    from dualpath.sim.calibration import DEFAULT_CALIBRATION

    calibration = DEFAULT_CALIBRATION if calibration is None else calibration
    kw: dict = {
        "calibration": calibration,
        "pe_scope": pe_scope,
        "read_tie": read_tie,
        "pe_tie": pe_tie,
        "pe_fetch": pe_fetch,
    }

    started = time.perf_counter()
    runs = plan_runs(scale)
    res: dict = {}
    trajs: dict = {}
    for run in runs:
        if progress is not None:
            progress(" ".join(str(x) for x in run))
        res[run] = _execute(run, scale, trajs, kw)
    points = _points(res, scale)
    return {
        "scale": scale.name,
        "agent_divisor": scale.agent_divisor,
        "horizon_s": scale.horizon_s,
        "points": points,
        "summary": _summary(points),
        "not_simulated": [{"published": p, "reason": r} for p, r in NOT_SIMULATED],
        "measured": _measured(res, scale),
        "runs": len(runs),
        "calibration": calibration.as_constants(),
        "pe_scope": pe_scope or "policy default (group)",
        "read_tie": read_tie,
        "pe_tie": pe_tie,
        "pe_fetch": pe_fetch,
        "wall_s": time.perf_counter() - started,
    }
