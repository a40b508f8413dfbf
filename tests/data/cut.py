"""Cut the small slices in tests/data from the reference data (run once by hand; see README.md).

    python tests/data/cut.py /path/to/shared/data

Traces: the first lines of each Mooncake trace (sessions are rebuilt from consecutive hash chains,
so a head keeps them whole) and every k-th row of each Azure CSV (the slice still spans the hour).
Kernel tables: the H100 rows the calibrated cost tests look up (the shapes of TEST_MODELS), every
column kept, written with pyarrow (zstd), with the table's ``collection_meta.yaml`` beside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
MOONCAKE_LINES = {"conversation_trace.jsonl": 400, "synthetic_trace.jsonl": 60}
AZURE_EVERY = {"AzureLLMInferenceTrace_code.csv": 20, "AzureLLMInferenceTrace_conv.csv": 40}
PERF = Path("hardware/aiconfigurator-perf-db/h100_sxm")

# (op folder, table) -> row filters; a row is kept when it matches any filter (all keys equal).
# DeepSeek-V3/V3.2: hidden 7168, fp8, MLA 128 heads, MoE 256 x 2048 top-8 (ep 8..32);
# Qwen2.5-32B: hidden 5120, bf16, GQA 40/8 x 128; gpt-oss-120b: MoE 128 x 2880 top-4.
TABLES: dict[tuple[str, str], list[dict[str, object]]] = {
    ("gemm", "gemm_perf"): [
        dict(gemm_dtype="fp8_block", n=7168, k=7168),
        dict(gemm_dtype="bfloat16", n=5120, k=5120),
    ],
    ("moe", "moe_perf"): [
        dict(
            hidden_size=7168,
            inter_size=2048,
            topk=8,
            num_experts=256,
            moe_tp_size=1,
            distribution="balanced",
            moe_dtype="fp8_block",
        ),
        dict(
            hidden_size=2880, inter_size=2880, topk=4, num_experts=128, moe_tp_size=1, distribution="balanced"
        ),
    ],
    ("mla", "generation_mla_perf"): [dict(num_heads=128, tp_size=1, kv_cache_dtype="fp8")],
    ("mla", "context_mla_perf"): [dict(num_heads=128, tp_size=1, kv_cache_dtype="fp8")],
    ("attention", "generation_attention_perf"): [
        dict(num_heads=40, num_key_value_heads=8, head_dim=128, window_size=0, kv_cache_dtype="bfloat16")
    ],
    ("attention", "context_attention_perf"): [
        dict(
            num_heads=40,
            num_key_value_heads=8,
            head_dim=128,
            window_size=0,
            attn_dtype="bfloat16",
            kv_cache_dtype="bfloat16",
        )
    ],
}


def _head(src: Path, dst: Path, lines: int) -> None:
    with open(src, encoding="utf-8") as fh:
        dst.write_text("".join(next(fh) for _ in range(lines)), encoding="utf-8")


def _every(src: Path, dst: Path, k: int) -> None:
    header, *rows = src.read_text(encoding="utf-8").splitlines(keepends=True)
    dst.write_text(header + "".join(rows[::k]), encoding="utf-8")


def _rows(table: pa.Table, filters: list[dict[str, object]]) -> pa.Table:
    keep = None
    for equal in filters:
        hit = None
        for column, value in equal.items():
            eq = pc.equal(table[column], pa.scalar(value, type=table.schema.field(column).type))
            hit = eq if hit is None else pc.and_(hit, eq)
        keep = hit if keep is None else pc.or_(keep, hit)
    return table.filter(keep)


def main(data: Path) -> None:
    for name, lines in MOONCAKE_LINES.items():
        out = HERE / "traces/mooncake" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        _head(data / "traces/mooncake" / name, out, lines)
    for name, k in AZURE_EVERY.items():
        out = HERE / "traces/azure_llm_2023" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        _every(data / "traces/azure_llm_2023" / name, out, k)
    for (op, table), filters in TABLES.items():
        (src,) = sorted((data / PERF / op).glob(f"*/*/{table}.parquet"))
        out = HERE / src.relative_to(data)
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = _rows(pq.read_table(src), filters)
        pq.write_table(rows, out, compression="zstd")
        meta = src.parent / "collection_meta.yaml"
        (out.parent / meta.name).write_bytes(meta.read_bytes())
        print(f"{out.relative_to(HERE)}: {rows.num_rows} rows")


# silicon measurements: aiconfigurator-core 0.12.0 wheel, systems/silicon_sample.csv, h100_sxm rows
# only (every other system is the held-out check: filtered out before anything else), this many
# per (backend, mode), every k-th row of the group in id order
SILICON_QUOTA = {
    ("sglang", "agg"): 4,
    ("sglang", "disagg"): 3,
    ("trtllm", "agg"): 9,
    ("trtllm", "disagg"): 3,
    ("vllm", "agg"): 9,
    ("vllm", "disagg"): 2,
}
SILICON_OUT = HERE / "aiconfigurator" / "silicon_h100_sxm_30.csv"


def cut_silicon(src: Path) -> None:
    import csv

    with open(src, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        fields = list(reader.fieldnames or [])
        rows = [r for r in reader if r["system"].strip() == "h100_sxm"]
    keep = []
    for (backend, mode), quota in SILICON_QUOTA.items():
        group = sorted(
            (r for r in rows if (r["backend"], r["mode"]) == (backend, mode)), key=lambda r: r["id"]
        )
        step = max(1, len(group) // quota)
        keep += group[::step][:quota]
    SILICON_OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(SILICON_OUT, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(keep)
    print(f"{SILICON_OUT.relative_to(HERE)}: {len(keep)} rows")


if __name__ == "__main__":
    if sys.argv[1].endswith(".csv"):  # python tests/data/cut.py systems/silicon_sample.csv
        cut_silicon(Path(sys.argv[1]))
    else:
        main(Path(sys.argv[1]))
