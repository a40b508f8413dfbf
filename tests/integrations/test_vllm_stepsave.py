"""The connector's step-save plan (``stepsave.py``): which vLLM blocks are gathered in which order
into the layer-major staging buffer, and which store blocks are written in the step and after it.
No vLLM needed."""

from __future__ import annotations

import numpy as np
import torch

from dualpath.integrations.vllm.plan import SaveSpec
from dualpath.integrations.vllm.savewrite import StagingPool
from dualpath.integrations.vllm.stepsave import plan_step_saves
from dualpath.runtime.kvstore import BlockLayout

LAYOUT = BlockLayout(num_layers=3, kv_bytes_per_token_layer=8, block_size=4)


def _spec(req: str, blocks: tuple[int, ...], table: tuple[int, ...], in_step: bool) -> SaveSpec:
    return SaveSpec(
        req_id=req,
        block_indices=blocks,
        hashes=tuple(f"{req}{b}" for b in blocks),
        parents=tuple(f"{req}{b - 1}" if b else None for b in blocks),
        token_ids=tuple(tuple(range(4 * b, 4 * b + 4)) for b in blocks),
        vllm_block_ids=table,
        in_step=in_step,
    )


def test_step_saves_gather_the_specs_blocks_in_order() -> None:
    # two vLLM blocks per store block; request a saves its store blocks 1 and 2 after the step,
    # request b its block 0 in the step (P/D): staging slots follow the specs' order
    specs = [
        _spec("a", (1, 2), (10, 11, 12, 13, 14, 15), in_step=False),
        _spec("b", (0,), (20, 21), in_step=True),
    ]
    pool = StagingPool()
    saves = plan_step_saves(specs, 2, LAYOUT, pool)
    assert saves.vllm_ids.dtype == torch.long
    assert saves.vllm_ids.tolist() == [12, 13, 14, 15, 20, 21]
    assert [(b.block_hash, b.column) for b in saves.after] == [("a1", 0), ("a2", 1)]
    assert [(b.block_hash, b.parent_hash, b.column) for b in saves.in_step] == [("b0", None, 2)]
    assert saves.stage.shape == (LAYOUT.num_layers, 3, LAYOUT.layer_block_bytes)
    assert np.shares_memory(saves.stage, saves.buf) and len(saves.buf) >= saves.stage.size
    assert saves.layers == set()
