"""The connector's settings, read from vLLM's ``kv_connector_extra_config`` (no vLLM import)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from dualpath.core.errors import ConfigError, require
from dualpath.core.units import gbps_to_bytes_per_s
from dualpath.runtime.kvstore.bandwidth import BandwidthLimiter, SharedTokenBucket, TokenBucket

_log = logging.getLogger("dualpath.integrations.vllm")
_KEYS = {
    "store_dir",
    "block_size",
    "verify",
    "capacity_bytes",
    "snic_gbps",
    "snic_state_file",
    "counters_file",
    "load",
}


def snic_limiter(gbps: float | None, state_file: str | None, direction: str) -> BandwidthLimiter | None:
    """One direction ("in": reads, "out": persists) of an emulated storage NIC of ``gbps`` Gbit/s;
    shared by every process naming ``state_file`` (one node), else this process's own; None if
    uncapped."""
    if gbps is None:
        return None
    rate = gbps_to_bytes_per_s(gbps)
    return TokenBucket(rate) if state_file is None else SharedTokenBucket(f"{state_file}.{direction}", rate)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectorSettings:
    """``store_dir``: the block store's directory (shared by every instance and ``dualpath serve``);
    ``block_size``: store block in tokens (default: vLLM's block size; else a whole multiple of it);
    ``verify``: crc32-check every read (default on); ``capacity_bytes``: the store's bound
    ("auto": its blocks plus 90% of the free space; None: unbounded); ``snic_gbps``: an emulated
    storage-NIC cap in Gbit/s per direction (reads in, persists out; None: uncapped), shared by every
    instance naming the same ``snic_state_file`` (one emulated node), else per instance;
    ``counters_file``: the worker's byte counters are written there as JSON after each load (the
    node agent's ``/metrics`` exports them; None: not written); ``load``: "layerwise" (a hit is
    copied in layer by layer in the request's own step, overlapped with its compute) or "async"
    (the request waits, unscheduled, until its hit is in; several requests' reads overlap, as
    vLLM's P/D connectors load; see hitload.py)."""

    store_dir: str
    block_size: int
    verify: bool = True
    capacity_bytes: int | None | Literal["auto"] = "auto"
    snic_gbps: float | None = None
    snic_state_file: str | None = None
    counters_file: str | None = None
    load: Literal["layerwise", "async"] = "layerwise"

    def snic_limiters(self) -> tuple[BandwidthLimiter | None, BandwidthLimiter | None]:
        """(read, write) limiters of the emulated storage NIC, or (None, None) when uncapped."""
        return (snic_limiter(self.snic_gbps, self.snic_state_file, "in"),
                snic_limiter(self.snic_gbps, self.snic_state_file, "out"))  # fmt: skip

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
        counters = extra.get("counters_file")
        require(counters is None or (isinstance(counters, str) and bool(counters)), "counters_file",
                counters, "must be a file path or null")  # fmt: skip
        load = extra.get("load", "layerwise")
        require(load in ("layerwise", "async"), "load", load, "choices: layerwise, async")
        return cls(store_dir=str(store_dir), block_size=block_size, verify=verify, capacity_bytes=cap,
                   snic_gbps=None if snic is None else float(snic), snic_state_file=state,
                   counters_file=counters, load=load)  # fmt: skip


_LAYER = re.compile(r"\.(\d+)\.")


def layer_index(layer_name: str) -> int:
    """The decoder layer of an attention module name (``model.layers.7.self_attn.attn`` -> 7)."""
    found = _LAYER.findall(f".{layer_name}.")
    if not found:
        raise ConfigError("layer_name", layer_name, "has no layer number")
    return int(found[-1])


READ_SIDES = ("pe", "de", "split")


class ReadSource(NamedTuple):
    """Where a request's hit is read: ``agent_url`` the decode node's agent (DE read path) or ""
    (read here: PE read path); ``capped``: through the emulated storage NICs; ``agent_from``: with
    an agent, the prompt token from which it reads (a split: the PE reads the tokens before it)."""

    agent_url: str = ""
    capped: bool = True
    agent_from: int = 0


def read_source(req_id: str, kv_transfer_params: dict[str, Any] | None) -> ReadSource:
    """Where a request's hit is read, from the ``dualpath`` entry of its ``kv_transfer_params``
    (set by the router, ``router.py``: ``{"read_side": "pe"}``, ``{"read_side": "de",
    "agent_url": URL}`` or ``{"read_side": "split", "agent_url": URL, "pe_read_len": N}`` (the PE
    reads the first N hit tokens, the agent the rest), optionally ``"snic": false``). Without the
    entry the hit is read here; ``"snic": false`` lifts the caps for this request (the no-I/O
    baseline). A malformed entry is logged and read here, capped: it must not stop the engine."""
    entry = (kv_transfer_params or {}).get("dualpath")
    if not isinstance(entry, dict) or "read_side" not in entry:
        return ReadSource()
    side, url, capped = entry.get("read_side"), entry.get("agent_url"), entry.get("snic", True) is not False
    agent = isinstance(url, str) and url.startswith(("http://", "https://"))
    if side == "de" and agent:
        return ReadSource(url, capped)
    pe_len = entry.get("pe_read_len")
    if side == "split" and agent and isinstance(pe_len, int) and not isinstance(pe_len, bool) and pe_len >= 0:
        return ReadSource(url, capped, pe_len)
    if side != "pe":
        _log.error("request %s: kv_transfer_params dualpath=%r: read_side must be one of %s (with an "
                   "http agent_url for 'de' and 'split', and an int pe_read_len >= 0 for 'split'); "
                   "reading on the PE side", req_id, entry, READ_SIDES)  # fmt: skip
    return ReadSource(capped=capped)


def saves_in_step(kv_transfer_params: dict[str, Any] | None) -> bool:
    """Whether a request's blocks are written within the step that completes them (before it can
    answer) rather than by the worker's writer thread after it: requests of a P/D cluster (a
    ``dualpath`` entry: the proxy's prefill request, and the decode request carrying what the
    prefill answered) and vLLM's own P/D flag ``do_remote_decode``. Their blocks are read by
    another instance as soon as this one answers; other requests' next turns come back here, where
    the blocks still being written count as hits (the worker waits for them before reading)."""
    params = kv_transfer_params or {}
    return isinstance(params.get("dualpath"), dict) or bool(params.get("do_remote_decode"))
