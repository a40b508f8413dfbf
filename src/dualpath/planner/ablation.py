"""Model ablations of the planner (heteropanacea.md, section V-D): validated ModelSpec transforms.

Each factor returns a ``dataclasses.replace`` of the spec whose published totals are recomputed
from the shapes (``spec.params``: they move by the shape difference), so every derived number
follows:

| factor | effect |
|---|---|
| ``kv_width=N`` (alias ``kv_lora_rank``) | KV elements per token per layer = N; KV bytes only, attention FLOPs unchanged (GQA, MLA and CSA alike) |
| ``active_experts_x=k`` | routed experts per token x k (must stay <= the routed experts) |
| ``total_experts_x=k`` | routed experts x k (active unchanged) |
| ``ffn_expansion=x`` | every FFN inner size (dense MLP, experts) x x, rounded |
| ``dtype_bytes=b`` | element bytes of every stage's weights and activations = b (``dtype_scope="all"``: KV too) |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from dualpath.core.errors import ConfigError, UnknownNameError, require
from dualpath.spec.models import ModelSpec
from dualpath.spec.params import shape_active_params, shape_total_params

FACTORS = ("kv_width", "kv_lora_rank", "active_experts_x", "total_experts_x", "ffn_expansion", "dtype_bytes")
DTYPE_SCOPES = ("weights", "all")


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(key, value, "must be a number")
    require(value == value and abs(value) != float("inf"), key, value, "must be finite")
    return float(value)


def _whole(key: str, factor: float, value: float, what: str) -> int:
    """``value`` (what ``factor`` gives) as a whole number >= 1; the error names ``factor``."""
    rounded = round(value)
    require(
        abs(value - rounded) < 1e-9 and rounded >= 1,
        key,
        factor,
        f"gives {value:g} {what}; must be a whole number >= 1",
    )
    return int(rounded)


def _experts(model: ModelSpec, key: str, factor: float, *, active: bool) -> dict[str, object]:
    require(model.is_moe, key, factor, f"{model.name} is dense (no routed experts)")
    require(factor > 0, key, factor, "must be positive")
    if active:
        k = _whole(key, factor, model.num_active_experts * factor, "active experts")
        require(
            k <= model.num_routed_experts,
            key,
            factor,
            f"{k} active experts exceed the {model.num_routed_experts} routed experts",
        )
        return {"num_active_experts": k}
    total = _whole(key, factor, model.num_routed_experts * factor, "routed experts")
    require(
        total >= model.num_active_experts,
        key,
        factor,
        f"{total} routed experts are fewer than the {model.num_active_experts} active",
    )
    return {"num_routed_experts": total}


def _change(model: ModelSpec, key: str, value: float, scope: str) -> dict[str, object]:
    if key in ("kv_width", "kv_lora_rank"):
        width = _whole(key, value, value, "KV elements")
        return {"kv_width_override": width}
    if key == "active_experts_x":
        return _experts(model, key, value, active=True)
    if key == "total_experts_x":
        return _experts(model, key, value, active=False)
    if key == "ffn_expansion":
        require(value > 0, key, value, "must be positive")
        out: dict[str, object] = {"intermediate_size": max(1, round(model.intermediate_size * value))}
        if model.is_moe:
            out["moe_intermediate_size"] = max(1, round(model.moe_intermediate_size * value))
        return out
    if key == "dtype_bytes":
        require(0 < value <= 8, key, value, "must be in (0, 8] bytes")
        return {"dtype_bytes_override": value, "dtype_override_kv": scope == "all"}
    raise UnknownNameError("ablation factor", key, FACTORS)


def apply_overrides(
    model: ModelSpec, overrides: Mapping[str, object], *, dtype_scope: str | None = None
) -> ModelSpec:
    """``model`` with ``overrides`` (factor -> value) applied, totals recomputed from shapes.

    ``dtype_scope`` ("weights", default, or "all") may also be given as ``overrides["dtype_scope"]``.
    Unknown factors raise :class:`UnknownNameError`; bad values :class:`ConfigError` naming them.
    """
    items = dict(overrides)
    given = items.pop("dtype_scope", None) if dtype_scope is None else dtype_scope
    given = "weights" if given is None else given
    require(given in DTYPE_SCOPES, "dtype_scope", given, f"choices: {', '.join(DTYPE_SCOPES)}")
    scope = str(given)
    if "kv_width" in items and "kv_lora_rank" in items:
        raise ConfigError("kv_lora_rank", items["kv_lora_rank"], "alias of kv_width; give one")
    if not items:
        return model
    changes: dict[str, object] = {}
    for key in sorted(items):
        if key not in FACTORS:
            raise UnknownNameError("ablation factor", key, FACTORS)
        changes.update(_change(model, key, _number(key, items[key]), scope))
    applied = ", ".join(f"{k}={items[k]}" for k in sorted(items))
    changes["source"] = f"{model.source}; ablation: {applied}"
    draft = dataclasses.replace(model, **changes)  # type: ignore[arg-type]
    # published totals move by the shape difference (a KV-only change leaves them as published)
    total = model.total_params + shape_total_params(draft) - shape_total_params(model)
    active = model.active_params + shape_active_params(draft) - shape_active_params(model)
    require(active > 0, "overrides", applied, "leave no active parameters")
    if model.kv_bytes_per_token_layer_override is not None and "kv_width_override" in changes:
        # the spec's KV layout (FP8 + scales) scales with the element count
        scale = draft.kv_elements_per_token_layer / model.kv_elements_per_token_layer
        changes["kv_bytes_per_token_layer_override"] = max(
            1, round(model.kv_bytes_per_token_layer_override * scale)
        )
    changes["total_params"] = max(total, active)
    changes["active_params"] = active
    return dataclasses.replace(model, **changes)  # type: ignore[arg-type]
