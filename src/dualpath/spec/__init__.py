"""Frozen tables: models, hardware (GPUs, nodes) and the paper's cluster presets."""

from dualpath.spec.clusters import CLUSTERS, ClusterPreset, get_cluster, parse_pd
from dualpath.spec.hardware import GPUS, NODES, GPUSpec, NodeSpec, get_gpu, get_node
from dualpath.spec.models import MODELS, ModelSpec, get_model

__all__ = [
    "CLUSTERS",
    "GPUS",
    "MODELS",
    "NODES",
    "ClusterPreset",
    "GPUSpec",
    "ModelSpec",
    "NodeSpec",
    "get_cluster",
    "get_gpu",
    "get_model",
    "get_node",
    "parse_pd",
]
