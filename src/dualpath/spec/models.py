"""Model table: ``ModelSpec``, ``MODELS`` (name -> spec) and exact-name lookup."""

from __future__ import annotations

from dualpath.core.registry import lookup
from dualpath.spec.model_aliases import resolve_model_name
from dualpath.spec.model_spec import ATTENTION_KINDS, ModelSpec
from dualpath.spec.model_table import MODELS
from dualpath.spec.params import (
    active_non_embedding_params,
    shape_active_params,
    shape_total_params,
)

__all__ = [
    "ATTENTION_KINDS",
    "MODELS",
    "ModelSpec",
    "active_non_embedding_params",
    "get_model",
    "shape_active_params",
    "shape_total_params",
]


def get_model(name: str) -> ModelSpec:
    """Return the model called ``name`` (or its Hugging Face id, spec/model_aliases.py);
    :class:`UnknownNameError` lists the choices."""
    return lookup(MODELS, name if name in MODELS else resolve_model_name(name), "model")
