"""The TTFT breakdown (the paper's four categories) tiles TTFT; the early attention window."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.harness.runner import run_one
from dualpath.sim.metrics import BREAKDOWN, early_cutoff_s


def test_breakdown_names_are_the_papers() -> None:
    assert BREAKDOWN == ("scheduling", "allocation", "reading", "prefill")


@pytest.mark.parametrize("system", ["basic", "dualpath", "oracle"])
def test_breakdown_sums_to_ttft(system: str, make_cluster, make_trajectories, tmp_path: Path) -> None:
    trajs = make_trajectories(48, turns=5, first=8192)
    cfg = SimConfig(system=get_system(system), cluster=make_cluster(1, 2), out_dir=str(tmp_path))
    res = run_one(cfg, trajs)
    bd = res["ttft_breakdown_s"]
    assert set(bd) == set(BREAKDOWN)
    assert all(v >= 0.0 for v in bd.values())
    assert math.isclose(sum(bd.values()), res["mean_ttft_s"], rel_tol=1e-9)
    if system != "oracle":
        assert bd["reading"] > 0.0  # KV was read from storage
    # per request: the four states follow each other and cover arrival -> first token
    with open(tmp_path / f"requests_{system}.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == res["num_requests"]
    for row in rows:
        t = [float(row[k]) for k in ("t_arrive", "t_pe", "t_alloc", "t_read", "t_first")]
        assert all(b >= a - 1e-6 for a, b in zip(t, t[1:])), row


def test_early_cutoff_is_the_5pct_first_token_time() -> None:
    t_first = [float(i) for i in range(100, 0, -1)]  # 100 requests, first tokens at 1..100 s
    assert early_cutoff_s(t_first) == 5.0
    assert early_cutoff_s(t_first, 0.5) == 50.0
    assert early_cutoff_s([3.0]) == 3.0
    assert early_cutoff_s([]) == 0.0


def test_early_attention_uses_only_early_iterations(make_cluster, make_trajectories) -> None:
    trajs = make_trajectories(64, turns=6, first=8192)
    res = run_one(SimConfig(system=get_system("dualpath"), cluster=make_cluster(1, 1)), trajs)
    early, run = res["attn_max_over_avg_early"], res["attn_max_over_avg"]
    assert early >= 1.0 and run >= 1.0
    assert early != run  # a window of the run, not the whole of it
