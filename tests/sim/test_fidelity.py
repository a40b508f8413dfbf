from __future__ import annotations

import csv
import json
import math

import pytest
from typer.testing import CliRunner

from dualpath.sim.harness import fidelity
from dualpath.sim.harness.fidelity import SCALES, plan_runs, run_fidelity

TOP_KEYS = {
    "scale",
    "agent_divisor",
    "horizon_s",
    "points",
    "summary",
    "not_simulated",
    "runs",
    "calibration",
    "wall_s",
}
POINT_KEYS = {"point", "group", "published", "simulated", "rel_error", "unit", "setting", "scaled"}


def _published_values() -> list[float]:
    """Every number of spec section 10 the module holds (so a point left out is noticed)."""
    vals: list[float] = [v for pubs in fidelity.PUB_JCT_S.values() for v in pubs]
    vals += [fidelity.PUB_HEADLINE, fidelity.PUB_ATTN_EARLY]
    vals += [v for pubs in fidelity.PUB_ABLATION_S.values() for v in pubs]
    vals += list(fidelity.PUB_ABLATION_REDUCTION_PCT.values())
    vals += list(fidelity.PUB_CAPACITY_APS.values()) + list(fidelity.PUB_CAPACITY_RATIO.values())
    vals += list(fidelity.PUB_SNIC.values()) + list(fidelity.PUB_SCALE_JCT_S.values())
    vals += [v for pubs in fidelity.PUB_SCALE_ONLINE.values() for v in pubs[1:]]
    return vals


@pytest.fixture(scope="module")
def tiny() -> dict:
    seen: list[str] = []
    result = run_fidelity(SCALES["tiny"], progress=seen.append)
    assert len(seen) == result["runs"] == len(plan_runs(SCALES["tiny"]))
    return result


def test_every_published_point_has_a_finite_error(tiny) -> None:
    assert TOP_KEYS <= set(tiny)
    points = tiny["points"]
    assert all(set(p) == POINT_KEYS for p in points)
    assert sorted(p["published"] for p in points) == sorted(_published_values())
    assert len({p["point"] for p in points}) == len(points)
    for p in points:
        assert p["rel_error"] is not None and math.isfinite(p["rel_error"]), p
        assert p["rel_error"] == pytest.approx((p["simulated"] - p["published"]) / abs(p["published"]))
        assert p["scaled"], p  # the tiny scale shrinks every point and says how
    s = tiny["summary"]
    assert s["points"] == s["with_error"] == len(points)
    assert 0 <= s["median_abs_rel_error"] <= s["max_abs_rel_error"]
    assert tiny["not_simulated"] and all(n["reason"] for n in tiny["not_simulated"])


def test_full_scale_runs_the_papers_settings() -> None:
    runs = plan_runs(SCALES["full"])
    offline = {(r[2], r[4]) for r in runs if r[0] == "offline"}
    assert {("2p4d", n) for n in (512, 1024, 2048, 4096)} <= offline
    assert ("48p96d", 49152) in offline
    assert ("online", "deepseek-v3.2", "44p88d", "dualpath", 8.8) in runs
    assert len(runs) == len(set(runs))


def test_cli_json_and_files(tmp_path, monkeypatch, tiny) -> None:
    from dualpath.cli import app

    real = SCALES["tiny"]
    monkeypatch.setitem(SCALES, "quick", real)  # the CLI's --quick on the tiny scale
    res = CliRunner().invoke(app, ["simulate", "fidelity", "--quick", "--json", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert TOP_KEYS | {"files"} <= set(out) and out["scale"] == "tiny"
    assert len(out["points"]) == len(tiny["points"])
    with open(tmp_path / "fidelity.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["point"] for r in rows] == [p["point"] for p in tiny["points"]]
    assert (tmp_path / "fidelity.png").stat().st_size > 5000
    assert [p["rel_error"] for p in out["points"]] == [p["rel_error"] for p in tiny["points"]]


def test_table_lists_every_point(tiny) -> None:
    import io

    from rich.console import Console

    from dualpath.cli.sim_fidelity import print_fidelity

    buf = io.StringIO()
    print_fidelity(tiny, out=Console(file=buf, width=250))
    text = buf.getvalue()
    assert "rel error" in text and "not simulated" in text
    for p in tiny["points"]:
        assert p["point"] in text, p["point"]


def test_cli_pe_scope_and_calibration_reach_every_run(monkeypatch, tiny) -> None:
    """``--pe-scope`` / ``--calibrate`` apply to every run (the session-14 central recipe needs no
    source edit) and are reported; a bad value names itself."""
    from dualpath.cli import app

    monkeypatch.setitem(SCALES, "quick", SCALES["tiny"])
    args = ["simulate", "fidelity", "--quick", "--json", "--pe-scope", "central",
            "--calibrate", "EP_LAYER_LATENCY_RDMA_S=0.00045", "--read-tie", "de", "--pe-tie", "read-queue"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["pe_scope"] == "central" and out["calibration"]["EP_LAYER_LATENCY_RDMA_S"] == 0.00045
    assert (out["read_tie"], out["pe_tie"]) == ("de", "read-queue")
    assert (tiny["read_tie"], tiny["pe_tie"]) == ("pe", "group")
    before = {p["point"]: p["simulated"] for p in tiny["points"]}
    assert any(p["simulated"] != before[p["point"]] for p in out["points"])
    for bad, named in (
        (["--pe-scope", "everywhere"], "everywhere"),
        (["--calibrate", "NOPE=1"], "NOPE"),
        (["--read-tie", "both"], "both"),
        (["--pe-tie", "coin"], "coin"),
    ):
        res = CliRunner().invoke(app, ["simulate", "fidelity", "--quick", *bad])
        assert res.exit_code != 0 and named in str(res.exception), res.output
