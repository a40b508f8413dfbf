"""Torch decoder (Llama / Qwen2 family) with a layer-at-a-time API, checkpoint loaders and tiny test models."""

from __future__ import annotations

from dualpath.runtime.model.config import DecoderConfig, rope_inv_freq
from dualpath.runtime.model.decoder import Decoder, Span
from dualpath.runtime.model.loader import (
    DEFAULT_MODEL,
    Checkpoint,
    build_hf_model,
    default_device,
    load_checkpoint,
    load_decoder,
    load_tokenizer,
    resolve_model,
)

__all__ = [
    "DEFAULT_MODEL", "Checkpoint", "Decoder", "DecoderConfig", "Span", "build_hf_model",
    "default_device", "load_checkpoint", "load_decoder", "load_tokenizer", "resolve_model",
    "rope_inv_freq",
]  # fmt: skip
