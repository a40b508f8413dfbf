"""The store layout of an HF model folder vLLM serves (no vLLM import): what agents and the router
open the shared block store with, the same layout the connector derives from vLLM's config."""

from __future__ import annotations

import json
from pathlib import Path

from dualpath.core.errors import ConfigError
from dualpath.runtime.kvstore import BlockLayout

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def model_layout(model_dir: str | Path, block_size: int, dtype: str = "float32") -> BlockLayout:
    """``BlockLayout`` of ``model_dir``'s KV (layers, KV heads x head size) in ``dtype``."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError("model", str(model_dir), "has no config.json (an HF folder: dualpath model export)")
    if dtype not in _DTYPE_BYTES:
        raise ConfigError("dtype", dtype, f"choices: {sorted(_DTYPE_BYTES)}")
    cfg = json.loads(path.read_text())
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    return BlockLayout(num_layers=int(cfg["num_hidden_layers"]), block_size=block_size,
                       kv_bytes_per_token_layer=2 * kv_heads * head_dim * _DTYPE_BYTES[dtype])  # fmt: skip
