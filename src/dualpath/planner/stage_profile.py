"""The STAGE objects of a plan (``stage_profile`` in ``plan disagg --json``; ``plan disagg profile``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dualpath.cost.efficiency import get_efficiency
from dualpath.cost.stages import STAGES, stage_roofline_s, stage_work
from dualpath.planner.ablation import apply_overrides
from dualpath.planner.catalog import catalog as load_catalog
from dualpath.planner.config import PlanConfig, allowed_precision
from dualpath.spec.models import get_model

if TYPE_CHECKING:
    from dualpath.spec.device import Device
    from dualpath.spec.models import ModelSpec

PROFILE_DECODE_BATCH = 64  # the decode batch the STAGE profile is read at (a typical busy step)
REFERENCE_DEVICE = {"npu": "npu-2500tf-hbm-190gb", "gpu": "h100"}  # profile's roofline position


def stage_profile_of(
    model: ModelSpec,
    input_len: float,
    output_len: float,
    precision: Mapping[str, int],
    devices: Mapping[str, Device],
    prefill_token_budget: int,
    efficiency: object,
) -> dict[str, dict]:
    """STAGE objects: prefill at the token-budget batch of prompts of I tokens, decode at
    ``PROFILE_DECODE_BATCH`` sequences of context I + O/2; ``bound`` on ``devices[stage]``."""
    length = max(1, round(input_len))
    out: dict[str, dict] = {}
    for s in STAGES:
        if s in ("pa", "pf"):
            batch, ctx = max(1, prefill_token_budget // length), length
        else:
            batch, ctx = PROFILE_DECODE_BATCH, round(input_len + output_len / 2)
        work = stage_work(model, s, batch=batch, context_len=ctx, bits=precision[s])
        dev = devices[s]
        compute_s, memory_s = stage_roofline_s(work, dev, efficiency=efficiency, bits=precision[s])  # type: ignore[arg-type]
        out[s] = {
            "flops": work.flops,
            "weight_bytes": work.weight_bytes,
            "kv_bytes": work.kv_bytes(),
            "kv_share": work.kv_share(),
            "arithmetic_intensity": work.arithmetic_intensity(),
            "bound": "compute" if compute_s >= memory_s else "memory",
            "at": {"batch": batch, "context_len": ctx},
            "device": dev.name,
        }
    return out


def stage_profile(
    model: str,
    io_ratio: float,
    overrides: Mapping[str, float] | None = None,
    precision: str = "16",
    catalog: str = "npu",
    *,
    output_len: int = 1000,
    prefill_token_budget: int = 16384,
) -> dict[str, dict]:
    """``plan disagg profile``: the four STAGE objects of ``model`` at I = O x ``io_ratio``, with
    the roofline position read on the catalogue's reference device (REFERENCE_DEVICE)."""
    cfg = PlanConfig(
        model=model,
        catalog=catalog,  # type: ignore[arg-type]
        io_ratio=io_ratio,
        precision=precision,
        overrides=dict(overrides or {}),
        output_len=output_len,
        prefill_token_budget=prefill_token_budget,
    )
    spec = get_model(model)
    spec = apply_overrides(spec, dict(cfg.overrides)) if cfg.overrides else spec
    allowed = allowed_precision(cfg)
    bits: dict[str, int] = {s: allowed[s][0] for s in STAGES}
    ref = next(d for d in load_catalog(catalog) if d.name == REFERENCE_DEVICE[catalog])
    return stage_profile_of(
        spec,
        max(1.0, output_len * io_ratio),
        float(output_len),
        bits,
        {s: ref.device for s in STAGES},
        prefill_token_budget,
        get_efficiency("ideal"),
    )
