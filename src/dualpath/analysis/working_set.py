"""Working set of cached KV in an online agent service, by Little's law (spec section 10).

Agents in flight L = lambda x W (arrival rate in agents/s times mean job completion time). An agent's
context grows roughly linearly to its final length, so on average it holds half of it:
working set = lambda x W x mean_final_len / 2 x bytes per cached token.

Bytes per cached token default to everything a cached prefix must keep (``cache_bytes_per_token``:
attention KV plus, for DSA models, the indexer's key cache: DeepSeek-V3.2 (656 + 132) x 61 = 48,068 B);
``basis="kv"`` counts the attention KV only (40,016 B).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dualpath.core.errors import require
from dualpath.core.units import GB
from dualpath.spec.models import ModelSpec

Basis = Literal["cache", "kv"]
BASES = ("cache", "kv")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkingSet:
    agents_in_flight: float
    mean_held_tokens: float
    bytes_per_token: int
    working_set_gb: float


def working_set(
    model: ModelSpec, aps: float, mean_jct_s: float, mean_total_len: float, basis: Basis = "cache"
) -> WorkingSet:
    require(aps > 0, "aps", aps, "must be positive (agents per second)")
    require(mean_jct_s > 0, "mean_jct_s", mean_jct_s, "must be positive")
    require(mean_total_len > 0, "mean_total_len", mean_total_len, "must be positive")
    require(basis in BASES, "basis", basis, f"choices: {', '.join(BASES)}")
    per_token = model.cache_bytes_per_token if basis == "cache" else model.kv_bytes_per_token
    in_flight = aps * mean_jct_s
    held = mean_total_len / 2
    return WorkingSet(
        agents_in_flight=in_flight,
        mean_held_tokens=held,
        bytes_per_token=per_token,
        working_set_gb=in_flight * held * per_token / GB,
    )
