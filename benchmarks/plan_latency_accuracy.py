"""How well `dualpath plan latency` predicts measured deployments, beside AIConfigurator.

Reads rows in AIConfigurator's silicon-measurement CSV layout (``systems/silicon_sample.csv`` of the
``aiconfigurator-core`` 0.12.0 wheel, Apache-2.0), keeps one system's rows (``--system``, default
h100_sxm: the only system this project validates on; the others are a held-out check and are
never read past the filter), predicts each with the benchmark simulation and prints, per backend x
mode x model, the rows predicted and the median |error| of TTFT and TPOT (and the signed median),
with AIConfigurator's own predictions of the same rows beside ours when ``--aic-python`` names a
Python that has ``aiconfigurator`` (it runs there via benchmarks/aic_estimate.py, fed the same
derived fields), as ratios ours / AIConfigurator. ``--out`` writes every row with both
predictions; ``--json`` prints the table as JSON. Timing (rows per second on this machine, one
core) is printed with the load average.

    python benchmarks/plan_latency_accuracy.py silicon_sample.csv \\
        --aic-python .venv-aic/bin/python --out predictions.csv

A row counts as covered when it gets a finite positive prediction; errors are ``pred / measured - 1``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from dualpath.core.errors import DualpathError
from dualpath.latency.predict import simulate
from dualpath.latency.rows import deployment_from_row, text, whole

HERE = Path(__file__).resolve().parent
LAYOUT_KEYS = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
# AIConfigurator reads these models from its bundled configs under their base names (the same
# architecture; it would otherwise download the Instruct config, and this machine has no internet)
AIC_MODEL_NAMES = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
}
HOPPER = ("h100_sxm", "h200_sxm")


def read_rows(path: Path, system: str) -> list[dict[str, str]]:
    """The rows of ``system`` only (the filter is the first thing done with the file)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [row for row in csv.DictReader(fh) if (row.get("system") or "").strip() == system]


def predict_ours(rows: list[dict[str, str]], limits: str = "auto") -> float:
    """Fill ``ours_ttft_ms`` / ``ours_tpot_ms`` / ``ours_error`` / ``assumed``; returns seconds."""
    start = time.perf_counter()
    for i, row in enumerate(rows):
        try:
            dep = deployment_from_row(row, limits)
            p = simulate(dep)
            row.update(
                ours_ttft_ms=p.ttft_s * 1e3, ours_tpot_ms=p.tpot_s * 1e3, assumed="; ".join(dep.assumed)
            )
        except DualpathError as exc:
            row.update(ours_error=str(exc))
        except Exception as exc:  # noqa: BLE001 - recorded per row, the run goes on
            row.update(ours_error=f"{type(exc).__name__}: {exc}")
        if (i + 1) % 50 == 0:
            print(f"dualpath: {i + 1}/{len(rows)} rows, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return time.perf_counter() - start


def aic_kwargs(row: dict[str, str]) -> dict[str, object] | None:
    """cli_estimate's arguments for ``row``, with the same derived fields as ours (None: refused)."""
    try:
        dep = deployment_from_row(row)
    except DualpathError:
        return None
    model = row["model_path"].strip()
    kw: dict[str, object] = dict(
        model_path=AIC_MODEL_NAMES.get(model, model),
        system_name=row["system"].strip(),
        mode=dep.mode,
        backend_name=dep.backend,
        isl=dep.isl,
        osl=dep.osl,
        database_mode="SILICON",
    )
    for key in ("gemm_quant_mode", "moe_quant_mode", "kvcache_quant_mode"):
        value = text(row, key)
        if value and "fp4" in value and row["system"].strip() in HOPPER:
            # no FP4 tensor cores on Hopper: the checkpoint's own precision, gpt-oss's MXFP4
            # experts weight-only (as ours, cost/deployment.py without_fp4)
            value = "w4a16_mxfp4" if key == "moe_quant_mode" and "gpt-oss" in model else None
        if value:
            kw[key] = value
    if dep.mode == "agg":
        kw["batch_size"] = int(dep.batch_size)
        for key in LAYOUT_KEYS:
            value = whole(row, key, zero_is_unset=True)
            if value is not None:
                kw[key] = value
        return kw
    for side in ("prefill", "decode"):
        for key in LAYOUT_KEYS:
            value = whole(row, f"{side}_{key}", zero_is_unset=True)
            if value is not None:
                kw[f"{side}_{key}"] = value
    kw.update(
        prefill_batch_size=dep.prefill_batch or 1,
        prefill_num_workers=dep.prefill_workers,
        decode_batch_size=dep.decode_batch or 1,
        decode_num_workers=dep.decode_workers,
    )
    return kw


def predict_aic(rows: list[dict[str, str]], python: str) -> float:
    """AIConfigurator's predictions in ``python`` (a subprocess); returns seconds."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        jobs, results = Path(tmp) / "jobs.jsonl", Path(tmp) / "results.jsonl"
        with open(jobs, "w", encoding="utf-8") as fh:
            for i, row in enumerate(rows):
                kw = aic_kwargs(row)
                if kw is None:
                    row["aic_error"] = "not a deployment (see ours_error)"
                else:
                    fh.write(json.dumps({"key": i, "kwargs": kw}) + "\n")
        subprocess.run([python, str(HERE / "aic_estimate.py"), str(jobs), str(results)], check=True)
        with open(results, encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                row = rows[rec["key"]]
                if "error" in rec:
                    row["aic_error"] = rec["error"]
                else:
                    row.update(aic_ttft_ms=rec["ttft_ms"], aic_tpot_ms=rec["tpot_ms"])
    return time.perf_counter() - start


def _errors(rows: list[dict[str, object]], who: str, metric: str) -> list[float]:
    out = []
    for row in rows:
        pred = row.get(f"{who}_{metric}_ms")
        measured = float(str(row[f"silicon_{metric}_ms"]))
        if isinstance(pred, float) and math.isfinite(pred) and pred > 0 and measured > 0:
            out.append(pred / measured - 1)
    return out


def summarize(rows: list[dict[str, object]], with_aic: bool) -> dict[str, dict[str, object]]:
    """Per group (backend / mode / model, then per backend / mode and all): coverage, median
    |error| and signed median of TTFT and TPOT, ours and AIConfigurator's."""
    groups: dict[str, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        b, m, model = row["backend"], row["mode"], row["model_path"]
        for key in (f"{b} {m} {model}", f"{b} {m} (all)", "all"):
            groups[key].append(row)
    table: dict[str, dict[str, object]] = {}
    for key in sorted(groups, key=lambda k: (k == "all", k.replace(" (all)", " ~"))):
        part = groups[key]
        entry: dict[str, object] = {"rows": len(part)}
        for who in ("ours", "aic") if with_aic else ("ours",):
            for metric in ("ttft", "tpot"):
                errs = _errors(part, who, metric)
                entry[f"{who}_{metric}_covered"] = len(errs)
                entry[f"{who}_{metric}_abs"] = statistics.median(abs(e) for e in errs) if errs else None
                entry[f"{who}_{metric}_signed"] = statistics.median(errs) if errs else None
        table[key] = entry
    return table


def _pct(x: object) -> str:
    return "-" if x is None else f"{100 * float(str(x)):.1f}%"


def print_table(table: dict[str, dict[str, object]], with_aic: bool) -> None:
    head = ["group", "rows", "covered", "TTFT |err|", "TPOT |err|"]
    if with_aic:
        head += ["AIC covered", "AIC TTFT", "AIC TPOT", "TTFT ours/AIC", "TPOT ours/AIC"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key, e in table.items():
        cells = [
            key,
            str(e["rows"]),
            str(e["ours_ttft_covered"]),
            f"{_pct(e['ours_ttft_abs'])} ({_pct(e['ours_ttft_signed'])})",
            f"{_pct(e['ours_tpot_abs'])} ({_pct(e['ours_tpot_signed'])})",
        ]
        if with_aic:
            ratios = []
            for metric in ("ttft", "tpot"):
                a, b = e[f"ours_{metric}_abs"], e[f"aic_{metric}_abs"]
                ratios.append("-" if a is None or not b else f"{float(str(a)) / float(str(b)):.2f}")
            cells += [
                str(e["aic_ttft_covered"]),
                f"{_pct(e['aic_ttft_abs'])} ({_pct(e['aic_ttft_signed'])})",
                f"{_pct(e['aic_tpot_abs'])} ({_pct(e['aic_tpot_signed'])})",
                *ratios,
            ]
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path, help="rows in AIConfigurator's silicon CSV layout")
    ap.add_argument("--system", default="h100_sxm")
    ap.add_argument(
        "--aic-python", help="a Python with aiconfigurator installed (AIC's predictions beside ours)"
    )
    ap.add_argument("--limit", type=int, default=0, help="only the first N rows of the system")
    ap.add_argument(
        "--limits", default="auto", help="engine limits: auto, backend, aiconfigurator (latency/rows.py)"
    )
    ap.add_argument("--out", type=Path, help="write every row with both predictions")
    ap.add_argument("--json", action="store_true", help="print the table as JSON")
    args = ap.parse_args(argv)
    rows: list[dict[str, object]] = list(read_rows(args.csv, args.system))  # type: ignore[arg-type]
    if args.limit:
        rows = rows[: args.limit]
    if not rows:
        print(f"no {args.system} rows in {args.csv}", file=sys.stderr)
        return 1
    ours_s = predict_ours(rows, args.limits)  # type: ignore[arg-type]
    aic_s = predict_aic(rows, args.aic_python) if args.aic_python else None  # type: ignore[arg-type]
    table = summarize(rows, with_aic=aic_s is not None)
    load = os.getloadavg()[0]
    timing = {"rows": len(rows), "ours_s": ours_s, "ours_rows_per_s": len(rows) / ours_s, "load_1min": load}
    if aic_s is not None:
        timing["aic_s"] = aic_s
    if args.out:
        fields = list(dict.fromkeys(k for row in rows for k in row))
        with open(args.out, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
    if args.json:
        print(json.dumps({"table": table, "timing": timing}, indent=1))
    else:
        print_table(table, with_aic=aic_s is not None)
        print(
            f"\n{len(rows)} {args.system} rows: dualpath {ours_s:.0f} s ({len(rows) / ours_s:.2f} rows/s, one core)"
            + (f", AIConfigurator {aic_s:.0f} s" if aic_s is not None else "")
            + f"; load average {load:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
