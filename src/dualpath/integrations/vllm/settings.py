"""The connector's settings, read from vLLM's ``kv_connector_extra_config`` (no vLLM import)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from dualpath.core.errors import ConfigError, require

_KEYS = {"store_dir", "block_size", "verify", "capacity_bytes"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectorSettings:
    """``store_dir``: the block store's directory (shared by every instance and ``dualpath serve``);
    ``block_size``: store block in tokens (default: vLLM's block size; else a whole multiple of it);
    ``verify``: crc32-check every read (default on); ``capacity_bytes``: the store's bound
    ("auto": its blocks plus 90% of the free space; None: unbounded)."""

    store_dir: str
    block_size: int
    verify: bool = True
    capacity_bytes: int | None | Literal["auto"] = "auto"

    @classmethod
    def from_extra(cls, extra: dict[str, Any], *, vllm_block_size: int) -> ConnectorSettings:
        unknown = sorted(set(extra) - _KEYS)
        if unknown:
            raise ConfigError("kv_connector_extra_config", unknown, f"unknown keys (known: {sorted(_KEYS)})")
        store_dir = extra.get("store_dir")
        require(isinstance(store_dir, str) and bool(store_dir), "store_dir", store_dir,
                "must name the block store's directory")  # fmt: skip
        block_size = int(extra.get("block_size", vllm_block_size))
        require(block_size >= vllm_block_size and block_size % vllm_block_size == 0, "block_size",
                block_size, f"must be a whole multiple of vLLM's block size {vllm_block_size}")  # fmt: skip
        verify = extra.get("verify", True)
        require(isinstance(verify, bool), "verify", verify, "must be true or false")
        cap = extra.get("capacity_bytes", "auto")
        require(cap in (None, "auto") or (isinstance(cap, int) and cap >= 0), "capacity_bytes", cap,
                "must be >= 0, null or 'auto'")  # fmt: skip
        return cls(store_dir=str(store_dir), block_size=block_size, verify=verify, capacity_bytes=cap)


_LAYER = re.compile(r"\.(\d+)\.")


def layer_index(layer_name: str) -> int:
    """The decoder layer of an attention module name (``model.layers.7.self_attn.attn`` -> 7)."""
    found = _LAYER.findall(f".{layer_name}.")
    if not found:
        raise ConfigError("layer_name", layer_name, "has no layer number")
    return int(found[-1])
