"""``dualpath models`` and ``dualpath hardware``: list the spec tables."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from dualpath.cli._common import print_json, print_table


def _print(title: str, columns: list[str], rows: list[list[object]], legend: tuple[str, ...] = ()) -> None:
    """A table (split to fit the terminal) whose first column is the name."""
    print_table(title, columns, rows, legend=legend)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def _model_row(m: Any) -> dict[str, Any]:
    """One model of ``spec.models.MODELS`` with its derived KV bytes and FLOPs."""
    return {
        "name": m.name,
        "layers": m.num_layers,
        "attention": m.attention_kind,
        "heads": m.num_heads,
        "kv_heads": m.num_kv_heads,
        "moe": m.is_moe,
        "experts": f"{m.num_active_experts}+{m.num_shared_experts}/{m.num_routed_experts}"
        if m.is_moe
        else "",
        "sparse_top_k": m.sparse_top_k,
        "total_params_b": m.total_params / 1e9,
        "active_params_b": m.active_params / 1e9,
        "kv_bytes_per_token_layer": m.kv_bytes_per_token_layer,
        "kv_bytes_per_token": m.kv_bytes_per_token,
        "linear_gflops_per_token": m.linear_flops_per_token / 1e9,
        "weight_gb": m.weight_bytes / 1e9,
        "source": m.source,
    }


# ``dualpath models``' table columns: field -> header
MODEL_COLUMNS = {
    "name": "model",
    "layers": "layers",
    "attention": "attention",
    "heads": "heads",
    "kv_heads": "KV heads",
    "experts": "experts (act+shared /routed)",
    "sparse_top_k": "sparse top-k (tokens)",
    "total_params_b": "params (billions)",
    "active_params_b": "active params (billions)",
    "kv_bytes_per_token_layer": "KV (bytes/token/layer)",
    "linear_gflops_per_token": "linear (GFLOP/token)",
}


def models(json_out: JsonOpt = False) -> None:
    """List the model table with derived KV bytes and FLOPs."""
    from dualpath.spec.models import MODELS

    rows = [_model_row(m) for m in MODELS.values()]
    if json_out:
        print_json({"models": rows})
        return
    _print(
        "Models",
        list(MODEL_COLUMNS.values()),
        [[r[c] for c in MODEL_COLUMNS] for r in rows],
        legend=(
            "experts: active routed + shared experts per token / routed experts; sparse "
            "top-k: tokens a sparse-attention query attends to (DSA); linear: FLOPs of the "
            "dense and expert matmuls per token.",
        ),
    )


# ``dualpath hardware``'s columns: field -> header
GPU_COLUMNS = {
    "name": "GPU",
    "year": "year",
    "bf16_tflops": "BF16 (TFLOPS)",
    "fp8_tflops": "FP8 (TFLOPS)",
    "fp4_tflops": "FP4 (TFLOPS)",
    "hbm_gb": "HBM (GB)",
    "hbm_bandwidth_gbs": "HBM (GB/s)",
    "tdp_w": "TDP (W)",
    "nic_gbps": "NIC (Gbit/s)",
}
NODE_COLUMNS = {
    "name": "node",
    "gpu": "GPU",
    "num_gpus": "GPUs",
    "cnic_gbps": "compute NIC (Gbit/s)",
    "num_snics": "storage NICs",
    "snic_gbps": "storage NIC (Gbit/s)",
    "dram_bandwidth_gbs": "DRAM (GB/s)",
    "dram_buffer_gb": "DRAM buffer (GB)",
}
CLUSTER_COLUMNS = {
    "name": "cluster",
    "model": "model",
    "node": "node",
    "num_prefill_nodes": "prefill nodes",
    "num_decode_nodes": "decode nodes",
    "num_gpus": "GPUs",
    "dram_buffer_gb": "DRAM buffer (GB)",
    "parallelism": "parallelism",
}


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
        ("GPUs (dense TFLOPS)", gpus, GPU_COLUMNS),
        ("Nodes", nodes, NODE_COLUMNS),
        ("Cluster presets", clusters, CLUSTER_COLUMNS),
    )
    for title, rows, cols in views:
        _print(title, list(cols.values()), [[r[c] for c in cols] for r in rows])


def register(app: typer.Typer) -> None:
    """Add ``models`` and ``hardware`` to the top-level app."""
    app.command("models")(models)
    app.command("hardware")(hardware)
