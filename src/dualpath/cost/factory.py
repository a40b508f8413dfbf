"""Pick a cost model by name: ``make_cost_model("roofline" | "calibrated", gpu, **kw)``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dualpath.core.errors import UnknownNameError
from dualpath.cost.base import CostConfig, CostModel
from dualpath.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency

if TYPE_CHECKING:
    from dualpath.spec.hardware import GPUSpec

COST_MODEL_NAMES = ("roofline", "calibrated")


def make_cost_model(
    name: str,
    gpu: GPUSpec,
    *,
    ep_size: int = 1,
    num_gpus_per_node: int = 8,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    data_dir: str | Path | None = None,
) -> CostModel:
    """Build a per-GPU cost model.

    ``ep_size``: GPUs in the EP group (1 for DP models such as Qwen2.5-32B; DeepSeek on the
    paper's nodes: 8 x the role's node count). ``data_dir`` (calibrated only): the shared data
    folder; default ``$DUALPATH_DATA_DIR`` or ``<repo root>/../shared/data``. Raises
    ``UnknownNameError`` for other names and ``ConfigError`` if calibrated tables are missing.
    """
    config = CostConfig(ep_size=ep_size, num_gpus_per_node=num_gpus_per_node, efficiency=efficiency)
    if name == "roofline":
        from dualpath.cost.roofline import RooflineCostModel

        return RooflineCostModel(gpu=gpu, config=config)
    if name == "calibrated":
        from dualpath.cost.calibrated import CalibratedCostModel

        return CalibratedCostModel.load(gpu=gpu, config=config, data_dir=data_dir)
    raise UnknownNameError("cost model", name, COST_MODEL_NAMES)
