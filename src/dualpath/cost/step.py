"""The work of one attention rank in one iteration (:class:`Step`) and its time by op (:class:`StepTime`).

cost/forward.py's ``Forward.step`` prices a step op by op (its module doc says how counts work).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from dualpath.core.errors import require
from dualpath.cost.kernel_base import OpTime


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """The work of one attention rank in one iteration (see the module doc)."""

    ctx_requests: float = 0.0
    isl: int = 0
    prefix: int = 0
    gen_requests: float = 0.0
    kv_len: float = 0.0

    def __post_init__(self) -> None:
        require(
            self.ctx_requests >= 0 and self.gen_requests >= 0,
            "requests",
            (self.ctx_requests, self.gen_requests),
            "must be >= 0",
        )
        require(self.ctx_requests == 0 or self.isl >= 1, "isl", self.isl, "must be >= 1")

    @property
    def num_tokens(self) -> float:
        return self.ctx_requests * self.isl + self.gen_requests


@dataclass(slots=True)
class StepTime:
    """Seconds of one iteration, by op (summed over layers), with each op's source."""

    breakdown_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    sources: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def add(self, op: str, t: OpTime, count: float = 1.0) -> None:
        self.breakdown_s[op] += t.time_s * count
        self.sources[op].add(t.source)

    @property
    def time_s(self) -> float:
        return sum(self.breakdown_s.values())


def fractional(count: float, fn: Callable[[float], OpTime]) -> OpTime:
    """``fn(n)`` at ``n = max(count, 1)`` scaled by ``count / n`` (kernels floor at one request)."""
    n = max(count, 1.0)
    return fn(n) * (count / n)
