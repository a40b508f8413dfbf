"""``dualpath plan latency``: TTFT / TPOT of a deployment's benchmark (dualpath.latency), or its
steady state in closed form (``--method closed-form``, cost/deployment.py).

One deployment from options (``--json`` or a table of the breakdown), or many from a CSV with
AIConfigurator's silicon-measurement columns (``--csv rows.csv --out predictions.csv``, read by
latency/rows.py): every row is written back with ``pred_ttft_ms``, ``pred_tpot_ms``, ``assumed``
(what the row left empty and was derived) and ``error`` (empty, or one line naming the field that
stopped it; the run goes on).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated, Any

import typer

from dualpath.cli._common import print_json, print_table
from dualpath.core.errors import ConfigError, DualpathError

CSV_COLUMNS = (
    "model_path",
    "system",
    "backend",
    "precision",
    "mode",
    "isl",
    "osl",
    "gemm_quant_mode",
    "moe_quant_mode",
    "batch_size",
    "tp_size",
    "pp_size",
    "attention_dp_size",
    "moe_tp_size",
    "moe_ep_size",
    "prefill_batch_size",
    "prefill_num_workers",
    "prefill_tp_size",
    "prefill_pp_size",
    "prefill_attention_dp_size",
    "prefill_moe_tp_size",
    "prefill_moe_ep_size",
    "decode_batch_size",
    "decode_num_workers",
    "decode_tp_size",
    "decode_pp_size",
    "decode_attention_dp_size",
    "decode_moe_tp_size",
    "decode_moe_ep_size",
)
PRED_COLUMNS = ("pred_ttft_ms", "pred_tpot_ms", "assumed", "error")

Int = Annotated[int | None, typer.Option()]
METHODS = ("simulation", "closed-form")


def _predictor(method: str):  # type: ignore[no-untyped-def]
    """``predict(dep, data_dir)`` of ``method``: the benchmark simulated, or the closed form."""
    if method not in METHODS:
        raise ConfigError("method", method, f"choices: {', '.join(METHODS)}")
    if method == "closed-form":
        from dualpath.cost.deployment import predict

        return predict
    from dualpath.latency.predict import simulate

    return simulate


def _mode(raw: str) -> str:
    word = raw.strip().lower()
    return "disagg" if word.startswith("disag") else "agg" if word.startswith("ag") else word


def _predict_row(row: dict[str, str], predict, data_dir: str | None, limits: str = "auto") -> bool:  # type: ignore[no-untyped-def]
    """Fill ``row``'s prediction columns; False when it could not be predicted (the reason in
    ``error``, one line naming the field)."""
    from dualpath.latency.rows import deployment_from_row

    try:
        dep = deployment_from_row(row, limits)
        p = predict(dep, data_dir)
        row.update(
            pred_ttft_ms=f"{p.ttft_s * 1e3:.4f}",
            pred_tpot_ms=f"{p.tpot_s * 1e3:.4f}",
            assumed="; ".join(dep.assumed),
            error="",
        )
        return True
    except DualpathError as exc:
        reason = str(exc)
    except Exception as exc:  # noqa: BLE001 - one bad row must not stop the run
        reason = f"{type(exc).__name__}: {exc}"
    row.update(pred_ttft_ms="", pred_tpot_ms="", assumed="", error=reason.replace("\n", " "))
    return False


def predict_csv(
    src: Path, dst: Path, data_dir: str | None = None, method: str = "simulation", limits: str = "auto"
) -> tuple[int, int]:
    """Predict every row of ``src`` into ``dst``; ``(rows, rows with an error)``."""
    from dualpath.cli.progress import Progress

    predict = _predictor(method)

    if not src.is_file():
        raise ConfigError("csv", str(src), "no such file")
    with open(src, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    missing = [c for c in ("model_path", "system", "isl", "osl") if c not in fields]
    if missing:
        raise ConfigError("csv", str(src), f"missing columns: {', '.join(missing)}")
    out_fields = [f for f in fields if f not in PRED_COLUMNS] + list(PRED_COLUMNS)
    errors = 0
    with Progress("predicting rows", total=len(rows)) as bar:
        for row in rows:
            errors += not _predict_row(row, predict, data_dir, limits)
            bar.advance()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=out_fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return len(rows), errors


def latency_cmd(
    model: Annotated[
        str | None, typer.Option(help="Model name or Hugging Face id (see `dualpath models`).")
    ] = None,
    system: Annotated[str, typer.Option(help="h100_sxm, h200_sxm, b200_sxm or gb200.")] = "h100_sxm",
    backend: Annotated[
        str,
        typer.Option(
            help="trtllm, vllm or sglang (its scheduler rules; kernels come from the system's tables)."
        ),
    ] = "trtllm",
    backend_version: Annotated[
        str | None,
        typer.Option(help="The backend's version: selects its scheduler defaults (default: the newest)."),
    ] = None,
    method: Annotated[
        str,
        typer.Option(
            help="simulation (the benchmark run: closed-loop clients, the backend's scheduler) or "
            "closed-form (the steady state, a fast path)."
        ),
    ] = "simulation",
    limits: Annotated[
        str,
        typer.Option(
            help="Engine limits: backend (its documented defaults), aiconfigurator (the limits "
            "AIConfigurator's generator deploys), or auto (CSV rows: latency/rows.py; else backend)."
        ),
    ] = "auto",
    precision: Annotated[
        str | None, typer.Option(help="bf16, fp8, fp8_block, nvfp4 (default: the checkpoint's).")
    ] = None,
    gemm_quant_mode: Annotated[
        str | None, typer.Option(help="Dense GEMM dtype (overrides --precision).")
    ] = None,
    moe_quant_mode: Annotated[str | None, typer.Option(help="Routed-expert dtype.")] = None,
    kv_dtype: Annotated[
        str | None, typer.Option(help="KV cache: bf16 or fp8 (default: fp8 with FP8 GEMMs).")
    ] = None,
    mode: Annotated[str, typer.Option(help="agg (one replica) or disagg (prefill/decode workers).")] = "agg",
    isl: Annotated[int, typer.Option(help="Input tokens per request.")] = 1024,
    osl: Annotated[int, typer.Option(help="Output tokens per request.")] = 128,
    batch: Annotated[int, typer.Option("--batch", help="Client concurrency.")] = 1,
    tp: Int = None,
    pp: Int = None,
    attention_dp: Int = None,
    moe_tp: Int = None,
    moe_ep: Int = None,
    prefill_tp: Int = None,
    prefill_pp: Int = None,
    prefill_attention_dp: Int = None,
    prefill_moe_tp: Int = None,
    prefill_moe_ep: Int = None,
    prefill_workers: Annotated[int, typer.Option()] = 1,
    prefill_batch: Annotated[
        int | None, typer.Option(help="Prompts per prefill batch (default: the backend's own limit).")
    ] = None,
    decode_tp: Int = None,
    decode_pp: Int = None,
    decode_attention_dp: Int = None,
    decode_moe_tp: Int = None,
    decode_moe_ep: Int = None,
    decode_workers: Annotated[int, typer.Option()] = 1,
    decode_batch: Annotated[
        int | None, typer.Option(help="Max decode batch per worker (default: concurrency / workers).")
    ] = None,
    csv_in: Annotated[
        Path | None, typer.Option("--csv", help="Predict every row of this CSV (AIConfigurator columns).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="With --csv: where to write the rows with predictions.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")] = False,
) -> None:
    """TTFT / TPOT of a deployment's benchmark (closed-loop clients, the backend's scheduler, on
    measured kernel tables; roofline where a table has no point; every op's source reported)."""
    from dualpath.cost.deployment import Deployment, Layout

    predict = _predictor(method)
    if csv_in is not None:
        _run_csv(csv_in, out, method, limits, json_out)
        return
    if model is None:
        raise ConfigError("model", None, "give --model (or --csv)")
    dep = Deployment(
        model=model,
        system=system,
        backend=backend.lower(),
        backend_version=backend_version,
        limits="backend" if limits == "auto" else limits,
        precision=precision,
        gemm_quant_mode=gemm_quant_mode,
        moe_quant_mode=moe_quant_mode,
        kv_dtype=kv_dtype,
        mode=_mode(mode),
        isl=isl,
        osl=osl,
        batch_size=batch,
        layout=Layout(tp=tp, pp=pp, attention_dp=attention_dp, moe_tp=moe_tp, moe_ep=moe_ep),
        prefill_batch=prefill_batch,
        prefill_workers=prefill_workers,
        prefill=Layout(
            tp=prefill_tp,
            pp=prefill_pp,
            attention_dp=prefill_attention_dp,
            moe_tp=prefill_moe_tp,
            moe_ep=prefill_moe_ep,
        ),
        decode_batch=decode_batch,
        decode_workers=decode_workers,
        decode=Layout(
            tp=decode_tp,
            pp=decode_pp,
            attention_dp=decode_attention_dp,
            moe_tp=decode_moe_tp,
            moe_ep=decode_moe_ep,
        ),
    )
    pred = predict(dep)
    if json_out:
        print_json(_latency_json(pred, dep, model, system, isl, osl, batch))
        return
    _print_latency(pred, dep, model, system)


def _run_csv(csv_in: Path, out: Path | None, method: str, limits: str, json_out: bool) -> None:
    """--csv: predict every row into --out and say how many rows stopped on an error."""
    if out is None:
        raise ConfigError("out", None, "--csv needs --out (the predictions CSV)")
    rows, errors = predict_csv(csv_in, out, method=method, limits=limits)
    summary = {"rows": rows, "errors": errors, "out": str(out)}
    if json_out:
        print_json(summary)
    else:
        typer.echo(f"{rows} rows -> {out} ({errors} with an error)")


def _latency_json(
    pred: Any, dep: Any, model: str, system: str, isl: int, osl: int, batch: int
) -> dict[str, Any]:
    return {
        **pred.to_json(),
        "model": model,
        "system": system,
        "backend": dep.backend,
        "mode": dep.mode,
        "isl": isl,
        "osl": osl,
        "batch_size": batch,
    }


def _print_latency(pred: Any, dep: Any, model: str, system: str) -> None:
    """The per-op TTFT / TPOT breakdown table with each op's source."""
    ops = sorted(set(pred.breakdown_ms["ttft"]) | set(pred.breakdown_ms.get("tpot", {})))
    print_table(
        f"{model} on {system} ({dep.mode}): TTFT {pred.ttft_s * 1e3:.4g} ms, TPOT {pred.tpot_s * 1e3:.4g} ms",
        ["op", "TTFT share (ms)", "TPOT share (ms)", "source"],
        [
            [
                op,
                pred.breakdown_ms["ttft"].get(op),
                pred.breakdown_ms.get("tpot", {}).get(op),
                pred.source.get(op, ""),
            ]
            for op in ops
        ],
        legend=[
            "source: the kernel table an op was read from, or 'roofline' and why "
            "(no table point); see docs/cost.md."
        ],
    )


def register(app: typer.Typer) -> None:
    """Add ``plan latency`` to the ``plan`` group."""
    app.command("latency")(latency_cmd)
