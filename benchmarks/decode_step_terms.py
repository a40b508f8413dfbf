"""The simulator's DS 660B decode step on one DE GPU, term by term, against batch size.

Layout as the paper deploys it (spec section 9): EP + attention DP, the DE EP group over 4 nodes
(EP 32), each GPU decoding its own batch at ``--context`` tokens. Terms (ms per step, all layers):
attention (MLA generation table + DSA indexer), dense GEMMs (replicated weights), routed experts
(MoE table at EP 32), the EP all-to-all floor (``EP_LAYER_LATENCY_RDMA_S`` x MoE layers), its bytes
over DeepEP's low-latency bandwidth (sim/ep_comm.py) and the host overhead. Also the two-micro-
batch-overlap (TBO) bound, ``max(2 x compute(b/2), 2 x a2a(b/2))`` per step: what DeepSeek's decode
overlap could give at best (weights are read once per micro-batch).

    python benchmarks/decode_step_terms.py [--context 65536] [--batches 1,4,16,32,64]
        [--calibrate EP_LAYER_LATENCY_RDMA_S=0.00044] [--json]
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from dualpath.sim.calibration import DEFAULT_CALIBRATION
from dualpath.sim.costs import CostCache
from dualpath.spec.hardware import GPUS
from dualpath.spec.models import get_model


def terms(batches: list[int], context: int, overrides: list[str], model_name: str) -> list[dict]:
    model = get_model(model_name)
    cal = DEFAULT_CALIBRATION.with_overrides(overrides)
    costs = CostCache(
        model, GPUS["h100"], name="auto", pe_ep_size=16, de_ep_size=32, num_gpus_per_node=8, cal=cal
    )
    rows = []
    for b in batches:
        t = costs.decode_terms_s(b, context)
        total = sum(t.values())
        compute = t["attention"] + t["dense"] + t["moe"]
        half = max(1, b // 2)
        h = costs.decode_terms_s(half, context)
        tbo = max(2 * (h["attention"] + h["dense"] + h["moe"]), 2 * (h["a2a_floor"] + h["a2a_bytes"]))
        rows.append(
            {
                "batch": b,
                **{k: v * 1e3 for k, v in t.items()},
                "compute": compute * 1e3,
                "step": total * 1e3,
                "sim_step": costs.decode_step_s(b, float(b * context)) * 1e3,
                "tbo_bound": (tbo + t["overhead"]) * 1e3,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v3.2")
    ap.add_argument("--context", type=int, default=65536)
    ap.add_argument("--batches", default="1,4,16,32,64")
    ap.add_argument("--calibrate", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    rows = terms(batches, args.context, args.calibrate, args.model)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    cols = [
        "attention",
        "dense",
        "moe",
        "a2a_floor",
        "a2a_bytes",
        "overhead",
        "step",
        "sim_step",
        "tbo_bound",
    ]
    table = Table(title=f"{args.model} decode step per DE GPU, EP 32, {args.context} context (ms)")
    table.add_column("batch/GPU", justify="right")
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(str(r["batch"]), *(f"{r[c]:.2f}" for c in cols))
    Console(width=160).print(table)
    first, last = rows[0]["step"], rows[-1]["step"]
    print(f"step grows {last / first - 1:+.0%} from {rows[0]['batch']} to {rows[-1]['batch']} per GPU")


if __name__ == "__main__":
    main()
