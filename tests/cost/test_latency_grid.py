"""`plan latency --csv` over a grid of real deployment shapes: every row a finite positive
prediction or an ``error`` naming why (never an exception, never NaN)."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

from dualpath.cli.plan_latency import CSV_COLUMNS, predict_csv

# (model, agg layout tp / attention_dp / moe_ep, disagg decode layout) as deployments run them
MODELS = {
    "Qwen/Qwen3-32B": [(2, 1, 1), (8, 1, 1)],
    "Qwen/Qwen3-235B-A22B": [(8, 1, 8)],
    "Qwen/Qwen3-235B-A22B-FP8": [(4, 1, 4), (1, 8, 8)],
    "meta-llama/Llama-3.1-8B-Instruct": [(1, 1, 1)],
    "meta-llama/Llama-3.1-70B-Instruct": [(4, 1, 1)],
    "deepseek-ai/DeepSeek-R1": [(8, 1, 8)],
    "deepseek-ai/DeepSeek-V3": [(1, 8, 8)],
    "openai/gpt-oss-120b": [(1, 1, 1), (4, 1, 4)],
    "nvidia/Llama-3.1-8B-Instruct-FP8": [(1, 1, 1)],
}
SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "gb200")
BACKENDS = ("trtllm", "vllm", "sglang")


def _row(**kw: object) -> dict[str, object]:
    row: dict[str, object] = {c: "" for c in CSV_COLUMNS}
    row.update(kw)
    return row


def _grid_rows() -> list[dict[str, object]]:
    rows = []
    combos = itertools.product(MODELS.items(), SYSTEMS)
    for n, ((model, layouts), system) in enumerate(combos):
        backend = BACKENDS[n % len(BACKENDS)]  # each backend meets every model and most systems
        for i, (tp, dp, ep) in enumerate(layouts):
            isl, osl, conc = [(4000, 500, 32), (1024, 1024, 128), (8000, 200, 8)][i % 3]
            rows.append(
                _row(
                    model_path=model,
                    system=system,
                    backend=backend,
                    mode="agg",
                    isl=isl,
                    osl=osl,
                    batch_size=conc,
                    tp_size=tp,
                    pp_size=1,
                    attention_dp_size=dp,
                    moe_tp_size=1,
                    moe_ep_size=ep,
                )
            )
        tp, dp, ep = layouts[-1]
        rows.append(
            _row(
                model_path=model,
                system=system,
                backend=backend,
                mode="disagg",
                isl=4000,
                osl=1000,
                batch_size=64,
                prefill_batch_size=1,
                prefill_num_workers=2,
                prefill_tp_size=tp,
                prefill_attention_dp_size=dp,
                prefill_moe_ep_size=ep,
                decode_batch_size=64,
                decode_num_workers=1,
                decode_tp_size=tp,
                decode_attention_dp_size=dp,
                decode_moe_ep_size=ep,
            )
        )
    return rows


BAD = [
    _row(model_path="acme/NoSuchModel", system="h100_sxm", isl=1000, osl=100, batch_size=1, tp_size=1),
    _row(model_path="Qwen/Qwen3-32B", system="h100_sxm", isl=1000, osl=100, batch_size=1, tp_size=3),
    _row(model_path="Qwen/Qwen3-32B", system="tpu_v9", isl=1000, osl=100, batch_size=1, tp_size=1),
    _row(model_path="Qwen/Qwen3-32B", system="h100_sxm", isl="", osl=100, batch_size=1, tp_size=1),
    _row(model_path="Qwen/Qwen3-32B", system="h100_sxm", isl=1000, osl=100, batch_size=1, tp_size=2.5),
    _row(
        model_path="Qwen/Qwen3-32B",
        system="h100_sxm",
        isl=1000,
        osl=100,
        batch_size=1,
        gemm_quant_mode="int3",
    ),
]
BAD_NAMES = ("model", "tp=3", "system", "isl", "tp_size", "gemm_quant_mode")


def test_every_grid_row_is_a_finite_prediction_or_a_named_error(tmp_path: Path) -> None:
    src, dst = tmp_path / "grid.csv", tmp_path / "pred.csv"
    rows = _grid_rows() + BAD
    with open(src, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    total, errors = predict_csv(src, dst)
    with open(dst, newline="") as fh:
        out = list(csv.DictReader(fh))
    assert total == len(rows) == len(out) and errors == len(BAD)
    for row in out[: -len(BAD)]:
        assert row["error"] == "", row
        ttft, tpot = float(row["pred_ttft_ms"]), float(row["pred_tpot_ms"])
        assert math.isfinite(ttft) and math.isfinite(tpot) and ttft > 0 and tpot > 0, row
    for row, name in zip(out[-len(BAD) :], BAD_NAMES, strict=True):
        assert row["pred_ttft_ms"] == "" and name in row["error"], row
        assert "Error:" not in row["error"]  # a ConfigError's message, not a stray exception
