"""Ours beside AIConfigurator's, per backend x mode, from one run of plan_latency_accuracy.py.

Reads the ``--out`` CSV of ``benchmarks/plan_latency_accuracy.py ... --aic-python PY --out P.csv``
(every row with both tools' predictions from the same run) and prints, per backend x mode, per
backend and over all rows: the rows, each tool's coverage and median |pred / measured - 1| of TTFT
and TPOT on the rows it predicts, the same two medians on the rows *both* predict, and the ratio
ours / AIConfigurator on those shared rows (below 1: ours closer), with a goals column (ours
TTFT <= 15 %, TPOT <= 10 %, better than AIConfigurator on both on the shared rows).

    python benchmarks/plan_latency_compare.py predictions.csv [--json]

``--aic-from OTHER.csv`` takes AIConfigurator's columns from another run's ``--out`` of the same
rows instead (AIConfigurator's side does not depend on dualpath's model, only on the rows' derived
fields; it costs 2-3 s a row on this machine): the rows must match one for one (``id``, isl, osl,
concurrency fields), else exit 1; the output says where AIConfigurator's columns came from.

Exits 1 when the file has no AIConfigurator column (the run was made without ``--aic-python``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

TTFT_GOAL, TPOT_GOAL = 0.15, 0.10


def _err(row: dict[str, str], who: str, metric: str) -> float | None:
    raw = row.get(f"{who}_{metric}_ms") or ""
    try:
        pred, measured = float(raw), float(row[f"silicon_{metric}_ms"])
    except ValueError:
        return None
    if not (math.isfinite(pred) and pred > 0 and measured > 0):
        return None
    return pred / measured - 1


def _median_abs(errs: list[float]) -> float | None:
    return statistics.median(abs(e) for e in errs) if errs else None


def group_stats(rows: list[dict[str, str]]) -> dict[str, object]:
    """Coverage and median |error| of each tool on its own rows and on the shared rows."""
    out: dict[str, object] = {"rows": len(rows)}
    shared = [
        r for r in rows if all(_err(r, w, m) is not None for w in ("ours", "aic") for m in ("ttft", "tpot"))
    ]
    out["shared"] = len(shared)
    for who in ("ours", "aic"):
        for metric in ("ttft", "tpot"):
            own = [e for e in (_err(r, who, metric) for r in rows) if e is not None]
            out[f"{who}_{metric}_covered"] = len(own)
            out[f"{who}_{metric}"] = _median_abs(own)
            out[f"{who}_{metric}_shared"] = _median_abs([_err(r, who, metric) for r in shared])  # type: ignore[misc]
    return out


def table(rows: list[dict[str, str]]) -> dict[str, dict[str, object]]:
    groups: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        b, m = row["backend"].strip(), row["mode"].strip()
        for key in (f"{b} {m}", f"{b} (all)", "all"):
            groups[key].append(row)
    order = sorted(groups, key=lambda k: (k == "all", k.split()[0], "(all)" in k, k))
    return {key: group_stats(groups[key]) for key in order}


def _pct(x: object) -> str:
    return "-" if x is None else f"{100 * float(str(x)):.1f} %"


def _ratio(a: object, b: object) -> str:
    return "-" if a is None or not b else f"{float(str(a)) / float(str(b)):.2f}"


def goals(e: dict[str, object]) -> str:
    ttft, tpot = e["ours_ttft"], e["ours_tpot"]
    marks = [
        "TTFT ok" if ttft is not None and float(str(ttft)) <= TTFT_GOAL else "TTFT miss",
        "TPOT ok" if tpot is not None and float(str(tpot)) <= TPOT_GOAL else "TPOT miss",
    ]
    for metric in ("ttft", "tpot"):
        a, b = e[f"ours_{metric}_shared"], e[f"aic_{metric}_shared"]
        if a is None or b is None:
            marks.append(f"{metric.upper()} vs AIC: no shared rows")
        else:
            marks.append(
                f"{metric.upper()} {'beats' if float(str(a)) < float(str(b)) else 'not better than'} AIC"
            )
    return "; ".join(marks)


def print_table(t: dict[str, dict[str, object]]) -> None:
    head = "| group | rows | ours TTFT / TPOT (rows) | AIC TTFT / TPOT (rows) | shared rows | shared: ours | shared: AIC | ratio TTFT / TPOT | goals |"
    print(head)
    print("|" + "---|" * 9)
    for key, e in t.items():
        print(
            f"| {key} | {e['rows']} | {_pct(e['ours_ttft'])} / {_pct(e['ours_tpot'])} ({e['ours_ttft_covered']}) "
            f"| {_pct(e['aic_ttft'])} / {_pct(e['aic_tpot'])} ({e['aic_ttft_covered']}) | {e['shared']} "
            f"| {_pct(e['ours_ttft_shared'])} / {_pct(e['ours_tpot_shared'])} "
            f"| {_pct(e['aic_ttft_shared'])} / {_pct(e['aic_tpot_shared'])} "
            f"| {_ratio(e['ours_ttft_shared'], e['aic_ttft_shared'])} / {_ratio(e['ours_tpot_shared'], e['aic_tpot_shared'])} "
            f"| {goals(e)} |"
        )


MATCH = ("id", "backend", "mode", "isl", "osl", "batch_size", "silicon_ttft_ms")
AIC_COLUMNS = ("aic_ttft_ms", "aic_tpot_ms", "aic_error")


def take_aic(rows: list[dict[str, str]], other: list[dict[str, str]]) -> str | None:
    """Copy AIConfigurator's columns of ``other`` into ``rows``; None, or why they do not match."""
    if len(rows) != len(other):
        return f"{len(rows)} rows against {len(other)}"
    for i, (a, b) in enumerate(zip(rows, other, strict=True)):
        for key in MATCH:
            if (a.get(key) or "") != (b.get(key) or ""):
                return f"row {i + 1}: {key} {a.get(key)!r} != {b.get(key)!r}"
    for a, b in zip(rows, other, strict=True):
        for key in AIC_COLUMNS:
            a[key] = b.get(key) or ""
    return None


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("predictions", type=Path, help="the --out CSV of plan_latency_accuracy.py")
    ap.add_argument("--aic-from", type=Path, help="AIConfigurator's columns from this run's --out instead")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = _read(args.predictions)
    if args.aic_from:
        why = take_aic(rows, _read(args.aic_from))
        if why:
            print(f"--aic-from {args.aic_from}: not the same rows ({why})", file=sys.stderr)
            return 1
        print(
            f"AIConfigurator's columns from {args.aic_from} (same rows, same derived fields)", file=sys.stderr
        )
    if not rows or not any("aic_ttft_ms" in r or "aic_error" in r for r in rows):
        print(
            f"{args.predictions}: no AIConfigurator predictions (run the accuracy benchmark with --aic-python)",
            file=sys.stderr,
        )
        return 1
    t = table(rows)
    if args.json:
        print(json.dumps(t, indent=1))
    else:
        print_table(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
