"""``dualpath models`` and ``dualpath hardware``: list the spec tables."""

from __future__ import annotations

from typing import Annotated

import typer

from dualpath.cli._common import console, print_json


def _print(title: str, columns: list[str], rows: list[list[object]]) -> None:
    """A rich table whose first column (the name) never wraps or truncates."""
    from rich.table import Table

    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, no_wrap=i == 0, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
                        for v in row))
    console.print(table)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def models(json_out: JsonOpt = False) -> None:
    """List the model table with derived KV bytes and FLOPs."""
    from dualpath.spec.models import MODELS

    rows = [{
        "name": m.name, "layers": m.num_layers, "attention": m.attention_kind,
        "heads": m.num_heads, "kv_heads": m.num_kv_heads, "moe": m.is_moe,
        "experts": f"{m.num_active_experts}+{m.num_shared_experts}/{m.num_routed_experts}"
        if m.is_moe else "", "sparse_top_k": m.sparse_top_k,
        "total_params_b": m.total_params / 1e9, "active_params_b": m.active_params / 1e9,
        "kv_bytes_per_token_layer": m.kv_bytes_per_token_layer,
        "kv_bytes_per_token": m.kv_bytes_per_token,
        "linear_gflops_per_token": m.linear_flops_per_token / 1e9,
        "weight_gb": m.weight_bytes / 1e9, "source": m.source,
    } for m in MODELS.values()]
    if json_out:
        print_json({"models": rows})
        return
    short = {"name": "model", "layers": "L", "attention": "attn", "heads": "H", "kv_heads": "KVH",
             "experts": "act+sh/E", "sparse_top_k": "top-k", "total_params_b": "tot B",
             "active_params_b": "act B", "kv_bytes_per_token_layer": "KV B/tok/L",
             "linear_gflops_per_token": "GF/tok"}
    _print("Models (params in billions, KV bytes per token per layer, linear GFLOP per token)",
           list(short.values()), [[r[c] for c in short] for r in rows])


def hardware(json_out: JsonOpt = False) -> None:
    """List GPUs, nodes and cluster presets."""
    from dataclasses import asdict

    from dualpath.spec.clusters import CLUSTERS
    from dualpath.spec.hardware import GPUS, NODES

    gpus = [asdict(g) for g in GPUS.values()]
    nodes = [asdict(n) for n in NODES.values()]
    clusters = [{**asdict(c), "num_gpus": c.num_gpus} for c in CLUSTERS.values()]
    if json_out:
        print_json({"gpus": gpus, "nodes": nodes, "clusters": clusters})
        return
    views = (
        ("GPUs (dense TFLOPS)", gpus, {"name": "gpu", "year": "year", "bf16_tflops": "bf16",
                                      "fp8_tflops": "fp8", "fp4_tflops": "fp4", "hbm_gb": "HBM GB",
                                      "hbm_bandwidth_gbs": "HBM GB/s", "tdp_w": "TDP W",
                                      "nic_gbps": "NIC Gbps"}),
        ("Nodes", nodes, {"name": "node", "gpu": "gpu", "num_gpus": "g", "cnic_gbps": "CNIC Gbps",
                          "num_snics": "s", "snic_gbps": "SNIC Gbps",
                          "dram_bandwidth_gbs": "DRAM GB/s", "dram_buffer_gb": "buffer GB"}),
        ("Cluster presets", clusters, {"name": "cluster", "model": "model", "node": "node",
                                       "num_prefill_nodes": "P", "num_decode_nodes": "D",
                                       "num_gpus": "GPUs", "dram_buffer_gb": "buffer GB",
                                       "parallelism": "parallel"}),
    )
    for title, rows, cols in views:
        _print(title, list(cols.values()), [[r[c] for c in cols] for r in rows])


def register(app: typer.Typer) -> None:
    """Add ``models`` and ``hardware`` to the top-level app."""
    app.command("models")(models)
    app.command("hardware")(hardware)
