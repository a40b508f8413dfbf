"""Small factories for cost tests: a tiny dense model and the real table entries."""

from __future__ import annotations

import pytest

from dualpath.cost import make_cost_model
from dualpath.spec.hardware import get_gpu
from dualpath.spec.models import ModelSpec, get_model


def make_dense_model(**overrides: object) -> ModelSpec:
    """A 2-layer dense GQA model with round shapes (bf16 weights and KV)."""
    fields: dict[str, object] = dict(
        name="tiny-dense",
        source="test",
        num_layers=2,
        hidden_size=4096,
        vocab_size=32000,
        attention_kind="gqa",
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        kv_dtype_bytes=2,
        weight_dtype_bytes=2,
        total_params=1_000_000_000,
        active_params=1_000_000_000,
    )
    fields.update(overrides)
    return ModelSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def dense_model() -> ModelSpec:
    return make_dense_model()


@pytest.fixture(scope="session")
def h100():  # type: ignore[no-untyped-def]
    return get_gpu("h100")


@pytest.fixture(scope="session")
def ds32():  # type: ignore[no-untyped-def]
    return get_model("deepseek-v3.2")


@pytest.fixture(scope="session")
def roofline_ep16(h100):  # type: ignore[no-untyped-def]
    return make_cost_model("roofline", h100, ep_size=16)
