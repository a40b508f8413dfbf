"""The simulated hardware: nodes, GPUs and their links, built from a ``ClusterPreset``.

Node ids: prefill nodes ``0..P-1``, then decode nodes ``P..P+D-1``. GPU (= engine) ids: the PE
GPUs node by node, then the DE GPUs. Per node: one SNIC link (reads and writes share it; the s SNICs
of a node are pooled), one DRAM link (half duplex: every byte in or out), a bounded DRAM buffer
(its claim queue is storage.py's).
Per GPU: its CNIC as two links, ``tx`` (the NIC reads host or device memory: sends, loopback source)
and ``rx`` (the NIC writes memory: receives, loopback destination). Local host<->device copies go
through the CNIC loopback (spec section 7), so they appear on both ``tx`` and ``rx`` of that GPU.

Dense (DP) models whose weights leave one GPU too little KV room run each engine as a TP group
(``tp_degree``): a ``Gpu`` is then that engine, with the summed HBM, FLOPs, HBM bandwidth and CNICs
of its GPUs (TP all-reduces over NVLink are not modelled). EP models always have TP 1.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from dualpath.sim.links import Link
from dualpath.sim.local import LocalClusterSpec

if TYPE_CHECKING:
    from dualpath.sim.calibration import Calibration
    from dualpath.spec.kv_pools import KVPools


class Node:
    __slots__ = (
        "node_id",
        "role",
        "snic",
        "snic_tx",
        "dram",
        "buffer_bytes",
        "buffer_used",
        "read_q",
        "gpus",
        "snic_read_bytes",
        "snic_write_bytes",
        "persist_end_s",
    )

    def __init__(
        self,
        node_id: int,
        role: str,
        snic_bytes_per_s: float,
        dram_bytes_per_s: float,
        buffer_bytes: float,
        snic_directions: str = "shared",
    ) -> None:
        self.node_id = node_id
        self.role = role  # "pe" | "de"
        self.snic = Link(f"n{node_id}.snic", "snic", snic_bytes_per_s)  # reads (storage -> node)
        # persists (node -> storage): the same link ("shared") or the SNIC's other direction
        self.snic_tx = (
            self.snic
            if snic_directions == "shared"
            else Link(f"n{node_id}.snic_tx", "snic", snic_bytes_per_s)
        )
        self.dram = Link(f"n{node_id}.dram", "dram", dram_bytes_per_s)
        self.buffer_bytes = buffer_bytes
        self.buffer_used = 0.0
        self.read_q = 0  # tokens queued to read from storage (the paper's read_q)
        self.gpus: list[int] = []
        self.snic_read_bytes = 0.0
        self.snic_write_bytes = 0.0
        self.persist_end_s = 0.0  # when this node's persists booked so far are done


class Gpu:
    __slots__ = ("gpu_id", "node_id", "role", "tx", "rx")

    def __init__(self, gpu_id: int, node_id: int, role: str, cnic_bytes_per_s: float) -> None:
        self.gpu_id = gpu_id
        self.node_id = node_id
        self.role = role
        self.tx = Link(f"g{gpu_id}.cnic_tx", "cnic_tx", cnic_bytes_per_s)
        self.rx = Link(f"g{gpu_id}.cnic_rx", "cnic_rx", cnic_bytes_per_s)


def tp_degree(model, gpu, num_gpus_per_node: int, cal: Calibration) -> int:
    """Smallest TP degree (a power of two dividing the node's GPUs) whose usable HBM holds the
    weights plus ``cal.min_kv_tokens_per_engine`` tokens of KV; the node's GPU count if none."""
    from dualpath.cost import weight_bytes_per_gpu

    need = weight_bytes_per_gpu(model, ep_size=1) + cal.min_kv_tokens_per_engine * model.kv_bytes_per_token
    tp = 1
    while tp < num_gpus_per_node:
        if num_gpus_per_node % tp == 0 and tp * gpu.hbm_gb * 1e9 * cal.hbm_usable_fraction >= need:
            return tp
        tp *= 2
    return num_gpus_per_node


def engine_gpu_spec(gpu, tp: int):
    """The GPUSpec of a TP group of ``tp`` GPUs seen as one engine (same name: kernel tables)."""
    if tp == 1:
        return gpu
    scale = {
        k: getattr(gpu, k) * tp
        for k in (
            "bf16_tflops",
            "fp8_tflops",
            "fp4_tflops",
            "int8_tflops",
            "hbm_gb",
            "hbm_bandwidth_gbs",
            "tdp_w",
            "nic_gbps",
            "pcie_gbs",
        )
        if getattr(gpu, k) is not None
    }
    return replace(gpu, **scale)


class Cluster:
    """Nodes and GPUs of one run, plus the lockstep units (EP groups, or single GPUs for DP).
    ``cal`` gives the storage efficiency, usable HBM and EP group sizes. ``preset`` a
    ``spec.clusters.ClusterPreset``, or the local cluster (``sim.local.LocalClusterSpec``: one
    engine per node, ``pools`` its engines' KV pools, the PE's and a DE's; see :meth:`_build_local`)."""

    def __init__(
        self,
        preset,
        cal: Calibration,
        snic_directions: str = "shared",
        pools: tuple[KVPools, KVPools] | None = None,
    ) -> None:
        # preset: spec.clusters.ClusterPreset; snic_directions: dualpath.core.links.SNIC_DIRECTIONS
        if isinstance(preset, LocalClusterSpec):
            assert pools is not None, "the local cluster's engines need their KV pools"
            self._build_local(preset, cal, pools)
            return
        node_spec = preset.node_spec
        self.preset = preset
        self.model = preset.model_spec
        self.kv_bytes_per_token: int = self.model.kv_bytes_per_token
        self.node_spec = node_spec
        is_ep = preset.parallelism == "ep_dp" and self.model.is_moe
        self.tp_size = 1 if is_ep else tp_degree(self.model, node_spec.gpu_spec, node_spec.num_gpus, cal)
        self.gpu_spec = engine_gpu_spec(node_spec.gpu_spec, self.tp_size)  # of one engine
        self.num_gpus_per_node = node_spec.num_gpus // self.tp_size  # engines per node
        cnic = node_spec.cnic_bytes_per_s * self.tp_size
        self.num_prefill_nodes = preset.num_prefill_nodes
        self.num_decode_nodes = preset.num_decode_nodes
        snic = node_spec.snic_bytes_per_s * cal.storage_efficiency
        buffer_bytes = preset.dram_buffer_gb * 1e9
        self.nodes: list[Node] = []
        self.gpus: list[Gpu] = []
        for node_id in range(self.num_prefill_nodes + self.num_decode_nodes):
            role = "pe" if node_id < self.num_prefill_nodes else "de"
            node = Node(node_id, role, snic, node_spec.dram_bytes_per_s, buffer_bytes, snic_directions)
            self.nodes.append(node)
        for node in self.nodes:  # PE GPUs first (PE nodes come first), then DE GPUs
            for _ in range(self.num_gpus_per_node):
                gpu = Gpu(len(self.gpus), node.node_id, node.role, cnic)
                node.gpus.append(gpu.gpu_id)
                self.gpus.append(gpu)
        self.pe_nodes = self.nodes[: self.num_prefill_nodes]
        self.de_nodes = self.nodes[self.num_prefill_nodes :]
        self.prefill_units = self._units(self.pe_nodes, cal.prefill_ep_nodes if is_ep else 0)
        self.decode_units = self._units(self.de_nodes, cal.decode_ep_nodes if is_ep else 0)

    def _build_local(self, spec: LocalClusterSpec, cal: Calibration, pools: tuple[KVPools, KVPools]) -> None:
        """The local cluster: one engine (a "GPU" here) per node, PE nodes first; SNICs at the cap
        (times the calibration's efficiency, 1 for the local cluster), persists on their other
        direction when ``spec.snic_directions`` says so; no DRAM link (host copies are inside the
        measured engine steps), CNICs at ``spec.cnic_gbps`` (uncapped: infinite); the PE and DE
        buffers as the runtime sizes them (``pools``: ``LocalClusterSpec.kv_pools``); every engine its
        own unit."""
        self.preset = spec
        self.model = None
        pe_pools, de_pools = pools
        self.kv_bytes_per_token = de_pools.block_bytes // de_pools.block_size
        self.node_spec = None
        self.gpu_spec = None
        self.tp_size = 1
        self.num_gpus_per_node = 1
        self.num_prefill_nodes = spec.num_prefill_engines
        self.num_decode_nodes = spec.num_decode_engines
        snic = spec.snic_bytes_per_s * cal.storage_efficiency
        inf = float("inf")
        self.nodes = []
        self.gpus = []
        for node_id in range(self.num_prefill_nodes + self.num_decode_nodes):
            pe = node_id < self.num_prefill_nodes
            buffer = (pe_pools if pe else de_pools).buffer_bytes
            node = Node(node_id, "pe" if pe else "de", snic, inf, float(buffer), spec.snic_directions)
            gpu = Gpu(node_id, node_id, node.role, spec.cnic_bytes_per_s)
            node.gpus.append(gpu.gpu_id)
            self.nodes.append(node)
            self.gpus.append(gpu)
        self.pe_nodes = self.nodes[: self.num_prefill_nodes]
        self.de_nodes = self.nodes[self.num_prefill_nodes :]
        self.prefill_units = self._units(self.pe_nodes, 0)
        self.decode_units = self._units(self.de_nodes, 0)

    def _units(self, nodes: list[Node], ep_nodes: int) -> list[list[int]]:
        """Lockstep GPU sets: EP groups of ``ep_nodes`` nodes, or one GPU each (``ep_nodes`` 0)."""
        gpu_ids = [g for node in nodes for g in node.gpus]
        if ep_nodes <= 0:
            return [[g] for g in gpu_ids]
        # as many EP groups of about ep_nodes nodes as fit, sizes differing by at most one node
        num_units = max(1, len(nodes) // ep_nodes)
        units, start = [], 0
        for i in range(num_units):
            count = len(nodes) // num_units + (1 if i < len(nodes) % num_units else 0)
            units.append([g for node in nodes[start : start + count] for g in node.gpus])
            start += count
        return units

    def links(self) -> list[Link]:
        out: list[Link] = []
        for node in self.nodes:
            out += (
                [node.snic, node.dram] if node.snic_tx is node.snic else [node.snic, node.snic_tx, node.dram]
            )
        for gpu in self.gpus:
            out += [gpu.tx, gpu.rx]
        return out

    def bytes_by_class(self) -> dict[str, float]:
        """KV bytes per link class and role (e.g. ``pe_snic``, ``de_cnic_rx``), plus model bytes."""
        out: dict[str, float] = {}
        for node in self.nodes:
            out[f"{node.role}_snic_read"] = out.get(f"{node.role}_snic_read", 0.0) + node.snic_read_bytes
            out[f"{node.role}_snic_write"] = out.get(f"{node.role}_snic_write", 0.0) + node.snic_write_bytes
            out[f"{node.role}_dram"] = out.get(f"{node.role}_dram", 0.0) + node.dram.kv_bytes
        for gpu in self.gpus:
            for link in (gpu.tx, gpu.rx):
                key = f"{gpu.role}_{link.cls}"
                out[key] = out.get(key, 0.0) + link.kv_bytes
                out["model_cnic"] = out.get("model_cnic", 0.0) + link.model_bytes
                role_key = f"{gpu.role}_model_cnic"
                out[role_key] = out.get(role_key, 0.0) + link.model_bytes
        return out
