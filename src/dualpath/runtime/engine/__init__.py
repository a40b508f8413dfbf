"""Prefill and decode engines: layerwise prefill over both KV read paths, paged batched decoding.

See docs/runtime.md. ``PrefillEngine`` and ``DecodeEngine`` are driven step by step (by
``LocalPipeline`` in one process, by the cluster's engine processes across processes).
"""

from __future__ import annotations

from dualpath.runtime.engine.decode import DecodeConfig, DecodeEngine
from dualpath.runtime.engine.kvbuffer import KVBuffer, RequestBlocks, payload_tensor
from dualpath.runtime.engine.local import Generation, GenRequest, LocalConfig, LocalPipeline
from dualpath.runtime.engine.paged import PagedKVCache
from dualpath.runtime.engine.prefill import PrefillConfig, PrefillEngine
from dualpath.runtime.engine.sampling import sample_token
from dualpath.runtime.engine.staging import LayerStaging
from dualpath.runtime.engine.types import (
    DecodeOutput,
    KVGeometry,
    PrefillOutput,
    PrefillRequest,
    RemoteKV,
    SamplingParams,
)

__all__ = [
    "DecodeConfig", "DecodeEngine", "DecodeOutput", "GenRequest", "Generation", "KVBuffer",
    "KVGeometry", "LayerStaging", "LocalConfig", "LocalPipeline", "PagedKVCache", "PrefillConfig",
    "PrefillEngine", "PrefillOutput", "PrefillRequest", "RemoteKV", "RequestBlocks",
    "SamplingParams", "payload_tensor", "sample_token",
]  # fmt: skip
