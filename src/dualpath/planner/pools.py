"""A pool as the search chose it, and the closed-form iteration times of a unit of pools.

A :class:`PoolPlan` is one device type with one (t, p, d, e) layout and per-stage precision.
A :class:`UnitTimer` turns a unit (modes.py: an attention side and an FFN side, one pool or two)
into the two numbers the run needs: the time of one prefill iteration and of one decode step.

- Merged sides (one pool): the stages run back to back on each lane, their times add.
- Split sides (two pools): the A side's lanes set the batches, the F side serves all their tokens
  spread over its own lanes, and each token's hidden state crosses N2N (``hidden x act_bytes`` each
  way per crossing), combined by :func:`parallel.af_layer_s` with m micro-batches. Decode crosses
  once per layer (the paper's DA<->DF round trip per layer). Prefill crosses by ``af_prefill``:
  ``round-trip-per-layer`` (every layer, as decode), ``once-per-prompt`` (one hidden state per token
  each way, the default) or ``free`` (nothing crosses, no N2N time): the paper names only a PA -> PF
  hand-over, unsized (docs/planner.md, "Rules").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from dualpath.core.errors import require
from dualpath.cost.stages import hidden_act_bytes_per_token
from dualpath.planner.links import D2D_GBS, N2N_GBS, n2n_bytes_per_s
from dualpath.planner.modes import DECODE_STAGES, PREFILL_STAGES, UnitSpec
from dualpath.planner.parallel import Layout, StageTimer, af_layer_s, weight_bytes_per_device

AF_PREFILL_RULES: Final = ("once-per-prompt", "round-trip-per-layer", "free")
AF_PREFILL_DEFAULT: Final = "once-per-prompt"


def af_crossings(rule: str, num_layers: int) -> int:
    """Times a prefill token's hidden state crosses a split unit's A/F boundary, each way, under
    ``rule`` (one of :data:`AF_PREFILL_RULES`): ``num_layers``, 1 or 0."""
    require(rule in AF_PREFILL_RULES, "af_prefill", rule, f"choices: {', '.join(AF_PREFILL_RULES)}")
    return {"round-trip-per-layer": num_layers, "once-per-prompt": 1, "free": 0}[rule]


if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.planner.catalog import CatalogDevice
    from dualpath.spec.models import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolPlan:
    """One pool of an allocation. ``bits`` is ((stage, bits), ...) for the pool's stages."""

    name: str
    stages: tuple[str, ...]
    device: CatalogDevice
    layout: Layout
    bits: tuple[tuple[str, int], ...]
    sigma: float = 0.0

    @property
    def bits_map(self) -> dict[str, int]:
        return dict(self.bits)

    @property
    def num_devices(self) -> int:
        return self.layout.num_devices

    def cost(self, kind: str) -> float:
        return self.num_devices * self.device.cost(kind)  # type: ignore[arg-type]

    def weights_per_device(self, model: ModelSpec) -> float:
        lay = self.layout
        return weight_bytes_per_device(model, self.bits_map, lay.tp, lay.pp, lay.ep)

    def key(self) -> tuple[object, ...]:
        lay = self.layout
        return (self.name, self.device.device.name, lay.tp, lay.pp, lay.dp, lay.ep, self.bits)

    def to_json(self, utilization: float = 0.0) -> dict[str, object]:
        """The issue's POOL object (section 9); ``stage_bits`` adds the per-stage precision."""
        lay = self.layout
        bits = self.bits_map
        usd = self.device.usd_per_hr
        return {
            "name": self.name,
            "stages": list(self.stages),
            "num_devices": self.num_devices,
            "tp": lay.tp,
            "pp": lay.pp,
            "dp": lay.dp,
            "ep": lay.ep,
            "precision_bits": max(bits.values()),
            "stage_bits": bits,
            "sigma": self.sigma,
            "utilization": utilization,
            "power_w": self.num_devices * self.device.power_w,
            "usd_per_hr": None if usd is None else self.num_devices * usd,
            "device": self.device.to_json(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """One candidate deployment of a mode: a PoolPlan per pool, its joint score and cost."""

    mode: str
    pools: tuple[PoolPlan, ...]
    sigma_joint: float
    cost: float

    def pool(self, name: str) -> PoolPlan:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def key(self) -> tuple[object, ...]:
        return tuple(p.key() for p in self.pools)


class PoolTimer:
    """Lane times of a pool's stages (built once per pool and run)."""

    __slots__ = ("plan", "timers")

    def __init__(
        self, model: ModelSpec, plan: PoolPlan, efficiency: Efficiency, d2d_gbs: float = D2D_GBS
    ) -> None:
        lay = plan.layout
        self.plan = plan
        self.timers: dict[str, StageTimer] = {}
        first = True
        for stage in plan.stages:
            self.timers[stage] = StageTimer(
                model=model,
                stage=stage,
                bits=plan.bits_map[stage],
                device=plan.device.device,
                tp=lay.tp,
                pp=lay.pp,
                ep=lay.ep,
                efficiency=efficiency,
                d2d_gbs=d2d_gbs,
                pp_handoff=first,
                expert_groups=max(1, lay.ep // lay.replica_devices),
            )
            first = False

    @property
    def lanes(self) -> int:
        return self.plan.layout.lanes

    def prefill_s(self, stages: Sequence[str], lengths: Sequence[int]) -> float:
        return sum(self.timers[s].prefill_s(lengths) for s in stages)

    def decode_s(self, stages: Sequence[str], batch: int, context_len: float) -> float:
        return sum(self.timers[s].decode_s(batch, context_len) for s in stages)


@dataclass(frozen=True, slots=True, kw_only=True)
class IterTime:
    """One iteration of a unit: its duration, each side's own busy time, N2N bytes each way."""

    time_s: float
    a_busy_s: float
    f_busy_s: float
    fwd_bytes: float
    bwd_bytes: float


class UnitTimer:
    """Iteration times of one unit (modes.UnitSpec) over its pools' timers."""

    __slots__ = (
        "unit",
        "a",
        "f",
        "layers",
        "crossings",
        "m",
        "act_a",
        "act_f",
        "bw",
        "latency_s",
        "a_pre",
        "f_pre",
        "a_dec",
        "f_dec",
    )

    def __init__(
        self,
        model: ModelSpec,
        unit: UnitSpec,
        timers: Mapping[str, PoolTimer],
        *,
        microbatches: int,
        n2n_gbs: float = N2N_GBS,
        latency_s: float = 0.0,
        af_prefill: str = AF_PREFILL_DEFAULT,
    ) -> None:
        self.unit = unit
        self.a = timers[unit.a_pool]
        self.f = timers[unit.f_pool]
        self.layers = model.num_layers
        # boundary crossings per token, each way, of a split unit (decode: one per layer)
        self.crossings = {"prefill": af_crossings(af_prefill, model.num_layers), "decode": model.num_layers}
        self.m = microbatches
        self.latency_s = latency_s
        a_bits, f_bits = self.a.plan.bits_map, self.f.plan.bits_map
        self.a_pre = [s for s in PREFILL_STAGES if s in a_bits and s == "pa"]
        self.f_pre = [s for s in PREFILL_STAGES if s in f_bits and s == "pf"]
        self.a_dec = [s for s in DECODE_STAGES if s in a_bits and s == "da"]
        self.f_dec = [s for s in DECODE_STAGES if s in f_bits and s == "df"]
        self.act_a = {
            ph: hidden_act_bytes_per_token(model, a_bits.get(s, 16))
            for ph, s in (("prefill", "pa"), ("decode", "da"))
        }
        self.act_f = {
            ph: hidden_act_bytes_per_token(model, f_bits.get(s, 16))
            for ph, s in (("prefill", "pf"), ("decode", "df"))
        }
        self.bw = n2n_bytes_per_s(self.a.plan.num_devices, self.f.plan.num_devices, n2n_gbs)

    @property
    def lanes(self) -> int:
        """Lanes that take batches: the attention side's (it holds the requests)."""
        return self.a.lanes

    def _combine(self, t_a: float, t_f: float, tokens: float, phase: str) -> IterTime:
        if not self.unit.is_split:
            return IterTime(time_s=t_a + t_f, a_busy_s=t_a + t_f, f_busy_s=0.0, fwd_bytes=0.0, bwd_bytes=0.0)
        crossings = self.crossings[phase]
        fwd = crossings * tokens * self.act_a[phase]
        bwd = crossings * tokens * self.act_f[phase]
        t_x = max(fwd, bwd) / self.bw + crossings * self.latency_s
        return IterTime(
            time_s=af_layer_s(t_a, t_f, t_x, self.m), a_busy_s=t_a, f_busy_s=t_f, fwd_bytes=fwd, bwd_bytes=bwd
        )

    def prefill(self, lane_batches: Sequence[Sequence[int]]) -> IterTime:
        """One prefill iteration: lane ``i`` prefills prompts ``lane_batches[i]``; all lanes run
        at once, the iteration ends with the slowest."""
        t_a = max(
            self.a.prefill_s(self.a_pre, b)
            + (self.a.prefill_s(self.f_pre, b) if not self.unit.is_split else 0.0)
            for b in lane_batches
        )
        tokens = sum(sum(b) for b in lane_batches)
        t_f = 0.0
        if self.unit.is_split:
            t_f = self.f.prefill_s(self.f_pre, [math.ceil(tokens / self.f.lanes)])
        return self._combine(t_a, t_f, tokens, "prefill")

    def decode(self, batch: int, context_len: float) -> IterTime:
        """One decode step of ``batch`` sequences (mean cached context ``context_len``), spread
        evenly over the A side's lanes (and the F side's)."""
        b_a = math.ceil(batch / self.a.lanes)
        t_a = self.a.decode_s(self.a_dec, b_a, context_len)
        if not self.unit.is_split:
            t_a += self.a.decode_s(self.f_dec, b_a, context_len)
            return self._combine(t_a, 0.0, batch, "decode")
        t_f = self.f.decode_s(self.f_dec, math.ceil(batch / self.f.lanes), context_len)
        return self._combine(t_a, t_f, batch, "decode")
