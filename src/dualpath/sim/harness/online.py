"""Online experiments: Poisson agent arrivals at a rate in APS, latency distributions, capacity.

A run admits agents for ``horizon_s`` seconds and measures the requests that arrive after a warm-up
(the first half of the horizon). An agent lives for its whole trajectory (~1,600 s for DS 660B at
64K), so the horizon must be a few agent lifetimes for the agent population to reach steady state
(default 3,600 s; 900 s over-predicts capacity by half); it stops early once the mean
TTFT of the last ``sim.metrics.STOP_WINDOW`` requests exceeds the SLO (the paper's stopping rule: a run stops at
TTFT > 4 s or at steady state). Capacity = the highest APS whose mean TTFT <= 4 s and mean
TPOT <= 50 ms; the sweep ends at the first rate that fails.
"""

from __future__ import annotations

import math

from dualpath.sim.config import SimConfig, get_system

TTFT_SLO_S = 4.0
TPOT_SLO_S = 0.050
WARMUP_FRACTION = 0.5
HORIZON_S = 3600.0  # seconds of arrivals per rate (see above)
DEFAULT_APS = "0.1:0.5:0.05"  # the sweep's rates (``parse_aps``)


def parse_aps(text: str) -> list[float]:
    """``"0.1:0.5:0.05"`` -> [0.1, 0.15, ..., 0.5]; ``"0.2,0.4"`` -> [0.2, 0.4]; ``"0.3"``."""
    from dualpath.core.errors import ConfigError

    try:
        if ":" in text:
            lo, hi, step = (float(x) for x in text.split(":"))
            if step <= 0 or hi < lo:
                raise ValueError
            n = int(math.floor((hi - lo) / step + 1e-9)) + 1
            return [round(lo + i * step, 6) for i in range(n)]
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError("aps", text, "expected lo:hi:step or a comma list of rates") from None


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def run_online(
    system: str, cluster, base_trajs, aps: float, *, horizon_s: float = HORIZON_S, seed: int = 0, **kw
) -> dict:
    """One online run at ``aps``; returns latency percentiles and whether it met the SLO."""
    from dualpath.sim.harness.runner import run_one
    from dualpath.workload import ReplayConfig, expand_agents

    num_agents = max(1, int(math.ceil(aps * horizon_s * 1.2)))
    trajs = expand_agents(base_trajs, ReplayConfig(num_agents=num_agents, seed=seed))
    cfg = SimConfig(
        system=get_system(system),
        cluster=cluster,
        seed=seed,
        aps=aps,
        horizon_s=horizon_s,
        ttft_stop_s=TTFT_SLO_S,
        max_sim_s=horizon_s,
        **kw,
    )
    res = run_one(cfg, trajs)
    lat = res.pop("latency")
    warm = horizon_s * WARMUP_FRACTION
    keep = [i for i, t in enumerate(lat["t_arrive"]) if t >= warm]
    out = {
        "aps": aps,
        "stopped": res["stopped"],
        "wall_s": res["wall_s"],
        "events": res["events"],
        "num_requests": res["num_requests"],
    }
    for name in ("ttft", "ttst", "tpot"):
        vals = [lat[name][i] for i in keep if not math.isnan(lat[name][i])]
        out[f"{name}_mean_s"] = sum(vals) / len(vals) if vals else None
        for q in (0.5, 0.9, 0.99):
            out[f"{name}_p{int(q * 100)}_s"] = _pct(vals, q)
    ttft, tpot = out["ttft_mean_s"], out["tpot_mean_s"]
    out["meets_slo"] = (
        not res["stopped"]
        and ttft is not None
        and ttft <= TTFT_SLO_S
        and (tpot is None or tpot <= TPOT_SLO_S)
    )
    out["snic_max_over_avg"] = res["snic_max_over_avg"]
    out["attn_max_over_avg"] = res["attn_max_over_avg"]
    out["bytes"] = res["bytes"]
    out["ttft_breakdown_s"] = res["ttft_breakdown_s"]
    return out


def capacity_sweep(system: str, cluster, base_trajs, rates: list[float], *, progress=None, **kw) -> dict:
    """Run rates in increasing order until one misses the SLO; capacity = last rate that met it."""
    points = []
    capacity = 0.0
    for aps in sorted(rates):
        point = run_online(system, cluster, base_trajs, aps, **kw)
        points.append(point)
        if progress is not None:
            progress()
        if not point["meets_slo"]:
            break
        capacity = aps
    return {"capacity_aps": capacity, "points": points}
