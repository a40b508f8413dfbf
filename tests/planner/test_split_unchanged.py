"""The A/F split of cost/shapes.py changed no existing number (issue 11, sections 1 and 13).

``data/split_reference.json`` was recorded before the split (see its ``note``): roofline per-layer
times of every model, the ModelShape terms, weight_bytes_per_gpu, and a small DS 660B 2P4D
simulation. Everything must come out bit for bit the same; the split terms must add up.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dualpath.cost import make_cost_model
from dualpath.cost.shapes import model_shape, weight_bytes_per_gpu
from dualpath.cost.stages import stage_weight_bytes, stage_work
from dualpath.spec.hardware import get_gpu
from dualpath.spec.models import MODELS
from dualpath.spec.params import (
    attention_params,
    expert_params,
    ffn_non_expert_params,
    shape_total_params,
)

REFERENCE = json.loads((Path(__file__).parent / "data" / "split_reference.json").read_text())
PREFILL_ITEMS = ([(0, 1000)], [(0, 8000), (4000, 4000)], [(30000, 2000)], [(0, 65536)])
DECODE_CONTEXTS = ([100], [1000] * 64, [30000, 60000, 5000], [64000] * 128)


def _times(model_name: str, ep: int) -> list:
    cm = make_cost_model("roofline", get_gpu("h100"), ep_size=ep)
    model = MODELS[model_name]
    out: list = []
    for items in PREFILL_ITEMS:
        out.append(list(cm.prefill_layer_times_s(model, items)))
    for contexts in DECODE_CONTEXTS:
        out.append(list(cm.decode_layer_times_s(model, contexts)))
    return out


@pytest.mark.parametrize("name", sorted(REFERENCE["cost"]))
def test_cost_per_layer_times_identical(name: str) -> None:
    ref = REFERENCE["cost"][name]
    assert _times(name, 1) == ref["roofline1"]
    assert _times(name, 16) == ref["roofline16"]
    model = MODELS[name]
    assert [weight_bytes_per_gpu(model, e) for e in (1, 8, 32)] == ref["wpg"]
    shape = model_shape(model)
    for key, value in ref["shape"].items():
        assert getattr(shape, key) == value, key


@pytest.mark.parametrize("name", sorted(MODELS))
def test_af_split_adds_up_to_model_shape(name: str) -> None:
    model = MODELS[name]
    shape = model_shape(model)
    attn_f, ffn_f = shape.attention_linear_flops_per_token_layer, shape.ffn_replicated_flops_per_token_layer
    assert attn_f > 0 and ffn_f > 0
    assert math.isclose(attn_f + ffn_f, shape.replicated_flops_per_token_layer, rel_tol=1e-12)
    attn_w, ffn_w = shape.attention_weight_bytes_layer, shape.ffn_replicated_weight_bytes_layer
    assert attn_w > 0 and ffn_w > 0
    assert math.isclose(attn_w + ffn_w, shape.replicated_weight_bytes_layer, rel_tol=1e-12)
    # element counts: every parameter is on exactly one side
    routed = model.num_moe_layers * model.num_routed_experts * expert_params(model)
    assert attention_params(model) + ffn_non_expert_params(model) + routed == shape_total_params(model)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_stage_terms_add_to_model_totals(name: str) -> None:
    model = MODELS[name]
    n, batch = 3000, 2
    pa = stage_work(model, "pa", batch=batch, context_len=n)
    pf = stage_work(model, "pf", batch=batch, context_len=n)
    assert math.isclose(pa.flops + pf.flops, batch * model.prefill_flops(0, n), rel_tol=1e-12)
    assert math.isclose(pa.attention_flops, batch * model.attention_flops(0, n), rel_tol=1e-12)
    da = stage_work(model, "da", batch=batch, context_len=n)
    df = stage_work(model, "df", batch=batch, context_len=n)
    linear = batch * model.linear_flops_per_token
    assert math.isclose(da.flops + df.flops, linear + batch * model.attention_flops(n, 1), rel_tol=1e-12)
    shape = model_shape(model)
    assert math.isclose(
        df.routed_flops,
        batch * shape.routed_flops_per_token_layer * model.num_layers,
        rel_tol=1e-12,
        abs_tol=1e-6,
    )
    assert math.isclose(
        da.flops - da.attention_flops,
        batch * model.num_layers * shape.attention_linear_flops_per_token_layer,
        rel_tol=1e-12,
    )
    # weights: A + F (non-expert + all routed experts) = every parameter at the stage's bits
    for bits in (4, 8, 16):
        a_ne, a_routed = stage_weight_bytes(model, "da", bits)
        f_ne, f_routed = stage_weight_bytes(model, "df", bits)
        assert a_routed == 0.0
        assert math.isclose(a_ne + f_ne + f_routed, shape_total_params(model) * bits / 8, rel_tol=1e-12)


def test_small_simulation_json_identical() -> None:
    from dualpath.sim.config import SimConfig, get_system
    from dualpath.sim.harness.experiments import WorkloadSpec, make_cluster, make_trajectories
    from dualpath.sim.harness.runner import run_one

    cluster = make_cluster("deepseek-v3.2", "2p4d", dram_buffer_gb=None)
    trajs = make_trajectories(WorkloadSpec(maxlen=65536, num_agents=REFERENCE["sim_agents"]))
    for name, expected in REFERENCE["sim_ds660_2p4d_16"].items():
        # (recorded before PE groups fetched between iterations: the tick cadence reproduces it)
        cfg = SimConfig(
            system=get_system(name), cluster=cluster, seed=0, cost_model="roofline", pe_fetch="tick"
        )
        got = json.loads(json.dumps(run_one(cfg, trajs), default=str))
        for key in ("wall_s", "requests_per_wall_s"):
            got.pop(key, None)
        assert got == expected, name
