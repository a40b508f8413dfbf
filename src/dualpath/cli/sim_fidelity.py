"""``dualpath simulate fidelity``: run spec section 10's published points, print simulated vs
published and the relative error per point (rich table), or one JSON object; CSV + PNG with --out."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from dualpath.cli._common import print_table

BREAKDOWN_KEYS = ("scheduling", "allocation", "reading", "prefill")  # sim/metrics.py BREAKDOWN
COLUMNS = ("point", "setting", "published", "simulated", "unit", "rel error", "scaled")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:+.1f}%"


def print_fidelity(result: dict[str, Any], out: Console | None = None) -> None:
    """One table of every point, then what was not simulated and the summary."""
    rows = [
        (
            p["point"],
            p["setting"],
            p["published"],
            p["simulated"],
            p["unit"],
            _pct(p["rel_error"]),
            p["scaled"] or "",
        )
        for p in result["points"]
    ]
    s = result["summary"]
    med, worst = s["median_abs_rel_error"], s["max_abs_rel_error"]
    legend = (
        (
            "published: spec section 10 (JCT read off the paper's figure, about +-2%). rel error = "
            "(simulated - published) / |published|; '-' when the simulated value is undefined."
        ),
        (
            f"{s['with_error']} of {s['points']} points with an error; median |rel error| "
            f"{_pct(med).lstrip('+')}, worst {_pct(worst).lstrip('+')}, {s['within_10pct']} within "
            "10%."
        ),
        (
            f"scale {result['scale']}: a 'scaled' point ran a smaller setting than the paper's (its "
            "error is the small setting's distance from the published number)."
        ),
        "not simulated: " + "; ".join(f"{n['published']} ({n['reason']})" for n in result["not_simulated"]),
    )
    print_table(
        f"fidelity: simulated vs published ({result['runs']} runs, {result['wall_s']:.0f} s)",
        COLUMNS,
        rows,
        legend=legend,
        out=out,
    )
    breakdowns = [m for m in result.get("measured", []) if "ttft_breakdown_s" in m]
    if breakdowns:
        print_table(
            "TTFT breakdown (mean s per request; spec section 10 gives no numbers, so no error)",
            ("run", "TTFT", "scheduling", "allocation", "reading KV", "prefill"),
            [
                (m["what"], m["ttft_s"], *(m["ttft_breakdown_s"][k] for k in BREAKDOWN_KEYS))
                for m in breakdowns
            ],
            out=out,
        )


def run_fidelity_cli(
    *,
    quick: bool,
    json_out: bool,
    out: str | None,
    scale_name: str | None = None,
    calibrate: list[str] | None = None,
    pe_scope: str | None = None,
    read_tie: str | None = None,
    pe_tie: str | None = None,
    pe_fetch: str | None = None,
) -> None:
    from dualpath.cli._common import check_scheduler_choices, print_json
    from dualpath.cli.progress import Progress
    from dualpath.sim.calibration import DEFAULT_CALIBRATION
    from dualpath.sim.harness.fidelity import SCALES, plan_runs, run_fidelity

    calibration = DEFAULT_CALIBRATION.with_overrides(calibrate or [])  # bad NAME=VALUE: a clear error
    ties = check_scheduler_choices(pe_scope, read_tie, pe_tie, pe_fetch)

    scale = SCALES[scale_name or ("quick" if quick else "full")]
    err = Console(stderr=True)
    with Progress("fidelity", total=len(plan_runs(scale)), console=err) as bar:
        first = [True]

        def step(description: str) -> None:
            if not first[0]:
                bar.advance()
            first[0] = False
            bar.update(f"fidelity {description}")

        result = run_fidelity(scale, progress=step, calibration=calibration, pe_scope=pe_scope, **ties)
        bar.advance()
    if out:
        from dualpath.sim.harness.fidelity_files import write_files

        result["files"] = write_files(result, out)
    if json_out:
        print_json(result)
        return
    print_fidelity(result)
    if out:
        Console().print(f"wrote {', '.join(result['files'])}")
