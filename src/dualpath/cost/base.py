"""The CostModel seam: per-GPU compute/memory time of prefill iterations and decode steps.

A cost model answers for ONE GPU. The simulator handles parallelism by how it groups GPUs; the
cost model only needs the EP group size (``CostConfig.ep_size``) to know how many routed experts a
GPU holds and how many tokens the group routes to it. Communication is *not* inside these times:
:func:`dualpath.cost.traffic.model_traffic_bytes` gives the EP all-to-all bytes so the simulator can
put them on the CNIC's high-priority lane and end the iteration at max(compute, traffic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dualpath.core.errors import ConfigError, require
from dualpath.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency

if TYPE_CHECKING:
    from dualpath.spec.models import ModelSpec

Item = tuple[int, int]  # (cached_len, new_len) of one request in a prefill batch


@runtime_checkable
class CostModel(Protocol):
    """Per-GPU time of model execution. All methods are pure and never mutate their inputs."""

    @property
    def name(self) -> str:
        """Registry name of the model ("roofline", "calibrated")."""
        ...

    def prefill_iteration_time_s(
        self, model: ModelSpec, items: Sequence[Item], *, group_num_tokens: int | None = None
    ) -> float:
        """Seconds of one prefill forward (all layers) of this engine's batch ``items``."""
        ...

    def prefill_layer_times_s(
        self, model: ModelSpec, items: Sequence[Item], *, group_num_tokens: int | None = None
    ) -> tuple[float, float]:
        """(attention_s, other_s) of ONE (average) layer; iteration = num_layers x their sum."""
        ...

    def decode_step_time_s(
        self, model: ModelSpec, context_lens: Sequence[int], *, group_batch_size: int | None = None
    ) -> float:
        """Seconds of one decode step (all layers) generating one token for each context."""
        ...

    def decode_layer_times_s(
        self, model: ModelSpec, context_lens: Sequence[int], *, group_batch_size: int | None = None
    ) -> tuple[float, float]:
        """(attention_s, other_s) of ONE (average) layer of a decode step."""
        ...

    def attention_predictor(self, model: ModelSpec) -> Any:
        """An object satisfying ``dualpath.policy.AttentionTimePredictor`` for ``model``."""
        ...

    def describe(self) -> dict[str, object]:
        """JSON-ready description (name, gpu, parallelism, efficiencies, table coverage)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CostConfig:
    """Parallel setting and constants of a cost model (one per engine role in the simulator).

    ``ep_size``: GPUs in the EP group (1 = each GPU a whole replica, the DP case; DeepSeek on the
    paper's nodes: 8 x the role's node count). ``group_num_tokens`` / ``group_batch_size`` passed
    to the methods override the balanced default of ``ep_size`` x this GPU's tokens.
    """

    ep_size: int = 1
    num_gpus_per_node: int = 8
    efficiency: Efficiency = field(default_factory=lambda: DEFAULT_EFFICIENCY)

    def __post_init__(self) -> None:
        require(self.ep_size >= 1, "ep_size", self.ep_size, "must be >= 1")
        require(self.num_gpus_per_node >= 1, "num_gpus_per_node", self.num_gpus_per_node, "must be >= 1")


def check_items(items: Sequence[Item]) -> None:
    """Validate a prefill batch: non-empty, cached_len >= 0, new_len >= 1, whole numbers."""
    if len(items) == 0:
        raise ConfigError("items", list(items), "a prefill batch needs at least one request")
    for item in items:
        if len(item) != 2:
            raise ConfigError("items", item, "each item is (cached_len, new_len)")
        cached_len, new_len = item
        if type(cached_len) is not int or type(new_len) is not int:  # fast path first
            if not (isinstance(cached_len, Integral) and isinstance(new_len, Integral)):
                raise ConfigError("items", item, "cached_len and new_len must be ints")
        if cached_len < 0 or new_len < 1:
            raise ConfigError("items", item, "need cached_len >= 0 and new_len >= 1")


def check_contexts(context_lens: Sequence[int]) -> None:
    """Validate a decode batch: non-empty, every context_len a positive int."""
    if len(context_lens) == 0:
        raise ConfigError("context_lens", list(context_lens), "a decode batch needs a request")
    if not all(type(length) is int for length in context_lens):  # fast path first
        for length in context_lens:
            if not isinstance(length, Integral):
                raise ConfigError("context_lens", length, "each context_len must be an int >= 1")
    shortest = min(context_lens)
    if shortest < 1:
        raise ConfigError("context_lens", shortest, "each context_len must be an int >= 1")


def check_group(value: int | None, local: int, ep_size: int, key: str) -> float:
    """Tokens (or requests) of the whole EP group: ``value`` if given, else balanced ``local x ep``."""
    if value is None:
        return float(local * ep_size)
    if value < local:
        raise ConfigError(key, value, f"must be >= this GPU's own {local}")
    return float(value)
