"""One step's saves on the connector's worker side: which vLLM blocks are gathered, in which order,
into which staging buffer, and which store blocks are written in the step and after it.

``DualPathConnector.save_kv_layer`` (connector.py) gathers every layer of the step's blocks into
``stage`` with one copy per layer; ``wait_for_save`` hands them to the writer (savewrite.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from dualpath.integrations.vllm.plan import SaveSpec
from dualpath.integrations.vllm.savewrite import StagedBlock, StagingPool
from dualpath.runtime.kvstore import BlockLayout


@dataclass(slots=True)
class StepSaves:
    """One step's saves on the worker: the staging buffer (``stage``: ``[num_layers, n_blocks,
    layer_block_bytes]`` over the pool buffer ``buf``), the vLLM block ids gathered into it, in
    order, the blocks to write in the step and after it, and the layers gathered so far."""

    buf: np.ndarray
    stage: np.ndarray
    vllm_ids: torch.Tensor
    in_step: list[StagedBlock]
    after: list[StagedBlock]
    layers: set[int] = field(default_factory=set)


def plan_step_saves(specs: list[SaveSpec], ratio: int, layout: BlockLayout, pool: StagingPool) -> StepSaves:
    """The staging buffer of a step's saves, taken from ``pool``: block ``c`` of it is the
    ``c``-th store block of the step's save specs, in order (``ratio`` vLLM blocks each)."""
    ids: list[int] = []
    in_step: list[StagedBlock] = []
    after: list[StagedBlock] = []
    for spec in specs:
        for j, b in enumerate(spec.block_indices):
            ids += spec.vllm_block_ids[b * ratio : (b + 1) * ratio]
            block = StagedBlock(spec.hashes[j], spec.parents[j], spec.token_ids[j], len(in_step) + len(after))
            (in_step if spec.in_step else after).append(block)
    n = len(in_step) + len(after)
    buf = pool.take(layout.num_layers * n * layout.layer_block_bytes)
    stage = buf[: layout.num_layers * n * layout.layer_block_bytes].reshape(
        layout.num_layers, n, layout.layer_block_bytes
    )
    vllm_ids = torch.tensor(ids, dtype=torch.long)
    return StepSaves(buf=buf, stage=stage, vllm_ids=vllm_ids, in_step=in_step, after=after)
