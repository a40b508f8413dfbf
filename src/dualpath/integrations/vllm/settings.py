"""The connector's settings, read from vLLM's ``kv_connector_extra_config`` (no vLLM import)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from dualpath.core.errors import ConfigError, require
from dualpath.core.units import gbps_to_bytes_per_s
from dualpath.runtime.kvstore.bandwidth import BandwidthLimiter, SharedTokenBucket, TokenBucket

_KEYS = {"store_dir", "block_size", "verify", "capacity_bytes", "snic_gbps", "snic_state_file"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectorSettings:
    """``store_dir``: the block store's directory (shared by every instance and ``dualpath serve``);
    ``block_size``: store block in tokens (default: vLLM's block size; else a whole multiple of it);
    ``verify``: crc32-check every read (default on); ``capacity_bytes``: the store's bound
    ("auto": its blocks plus 90% of the free space; None: unbounded); ``snic_gbps``: an emulated
    storage-NIC cap in Gbit/s per direction (reads in, persists out; None: uncapped), shared by every
    instance naming the same ``snic_state_file`` (one emulated node), else per instance."""

    store_dir: str
    block_size: int
    verify: bool = True
    capacity_bytes: int | None | Literal["auto"] = "auto"
    snic_gbps: float | None = None
    snic_state_file: str | None = None

    def snic_limiters(self) -> tuple[BandwidthLimiter | None, BandwidthLimiter | None]:
        """(read, write) limiters of the emulated storage NIC, or (None, None) when uncapped."""
        if self.snic_gbps is None:
            return None, None
        rate = gbps_to_bytes_per_s(self.snic_gbps)
        if self.snic_state_file is None:
            return TokenBucket(rate), TokenBucket(rate)
        return (SharedTokenBucket(f"{self.snic_state_file}.in", rate),
                SharedTokenBucket(f"{self.snic_state_file}.out", rate))  # fmt: skip

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
        snic = extra.get("snic_gbps")
        require(snic is None or (isinstance(snic, (int, float)) and snic > 0), "snic_gbps", snic,
                "must be > 0 (Gbit/s) or null")  # fmt: skip
        state = extra.get("snic_state_file")
        require(state is None or (isinstance(state, str) and bool(state)), "snic_state_file", state,
                "must be a file path or null")  # fmt: skip
        return cls(store_dir=str(store_dir), block_size=block_size, verify=verify, capacity_bytes=cap,
                   snic_gbps=None if snic is None else float(snic), snic_state_file=state)  # fmt: skip


_LAYER = re.compile(r"\.(\d+)\.")


def layer_index(layer_name: str) -> int:
    """The decoder layer of an attention module name (``model.layers.7.self_attn.attn`` -> 7)."""
    found = _LAYER.findall(f".{layer_name}.")
    if not found:
        raise ConfigError("layer_name", layer_name, "has no layer number")
    return int(found[-1])
