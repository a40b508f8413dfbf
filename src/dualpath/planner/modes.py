"""The four deployment modes: which stages share a pool, and which pools run together.

| mode | pools |
|---|---|
| ND   | one pool ``nd`` with PA, PF, DA and DF |
| PD   | ``p`` = PA + PF; ``d`` = DA + DF |
| AF   | ``a`` = PA + DA; ``f`` = PF + DF |
| PDAF | four pools ``pa``, ``pf``, ``da``, ``df`` |

A **unit** is what runs one iteration: its attention side (``a_pool``) and FFN side (``f_pool``)
take part in every layer of it. When both sides are one pool the stages run back to back on the same
devices (times add, the hand-over is free); when they are two pools every layer makes one activation
round trip A -> F -> A over N2N. A unit hosting both phases (ND, AF) runs prefill first; PD and PDAF
have a prefill unit and a decode unit that run concurrently, joined by the KV hand-off over N2N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from dualpath.core.errors import require
from dualpath.core.registry import lookup

Phase = Literal["prefill", "decode"]
MODES: Final = ("nd", "pd", "af", "pdaf")
PREFILL_STAGES: Final = ("pa", "pf")
DECODE_STAGES: Final = ("da", "df")
ATTENTION_STAGES: Final = ("pa", "da")


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    """One pool: a name and the stages it hosts (one device type, one parallel layout)."""

    name: str
    stages: tuple[str, ...]

    @property
    def phases(self) -> tuple[Phase, ...]:
        out: list[Phase] = []
        if any(s in PREFILL_STAGES for s in self.stages):
            out.append("prefill")
        if any(s in DECODE_STAGES for s in self.stages):
            out.append("decode")
        return tuple(out)

    @property
    def holds_kv(self) -> bool:
        """Hosts decode attention: the admitted requests' KV lives here."""
        return "da" in self.stages


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitSpec:
    """One execution unit: its attention-side and FFN-side pools and the phases it runs."""

    name: str
    a_pool: str
    f_pool: str
    phases: tuple[Phase, ...]

    @property
    def is_split(self) -> bool:
        """A and F live in different pools: one N2N activation round trip per layer."""
        return self.a_pool != self.f_pool


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeSpec:
    name: str
    pools: tuple[PoolSpec, ...]
    units: tuple[UnitSpec, ...]
    kv_boundary: tuple[str, str] | None  # (prefill-side pool, decode-side pool) over N2N

    def pool(self, name: str) -> PoolSpec:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def pool_of_stage(self, stage: str) -> PoolSpec:
        for p in self.pools:
            if stage in p.stages:
                return p
        raise KeyError(stage)

    @property
    def kv_pool(self) -> PoolSpec:
        return self.pool_of_stage("da")


def _both(name: str, a: str, f: str) -> UnitSpec:
    return UnitSpec(name=name, a_pool=a, f_pool=f, phases=("prefill", "decode"))


MODE_SPECS: Final[dict[str, ModeSpec]] = {
    "nd": ModeSpec(
        name="nd",
        pools=(PoolSpec(name="nd", stages=("pa", "pf", "da", "df")),),
        units=(_both("nd", "nd", "nd"),),
        kv_boundary=None,
    ),
    "pd": ModeSpec(
        name="pd",
        pools=(PoolSpec(name="p", stages=("pa", "pf")), PoolSpec(name="d", stages=("da", "df"))),
        units=(
            UnitSpec(name="p", a_pool="p", f_pool="p", phases=("prefill",)),
            UnitSpec(name="d", a_pool="d", f_pool="d", phases=("decode",)),
        ),
        kv_boundary=("p", "d"),
    ),
    "af": ModeSpec(
        name="af",
        pools=(PoolSpec(name="a", stages=("pa", "da")), PoolSpec(name="f", stages=("pf", "df"))),
        units=(_both("af", "a", "f"),),
        kv_boundary=None,
    ),
    "pdaf": ModeSpec(
        name="pdaf",
        pools=tuple(PoolSpec(name=s, stages=(s,)) for s in ("pa", "pf", "da", "df")),
        units=(
            UnitSpec(name="p", a_pool="pa", f_pool="pf", phases=("prefill",)),
            UnitSpec(name="d", a_pool="da", f_pool="df", phases=("decode",)),
        ),
        kv_boundary=("pa", "da"),
    ),
}


def mode_spec(name: str) -> ModeSpec:
    """The mode called ``name`` (nd, pd, af, pdaf); :class:`UnknownNameError` lists the choices."""
    return lookup(MODE_SPECS, name, "mode")


def parse_modes(text: str | tuple[str, ...]) -> tuple[str, ...]:
    """``"nd,pdaf"`` -> ("nd", "pdaf") in the canonical order; unknown names raise."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    for n in names:
        mode_spec(n)
    require(len(names) > 0, "modes", text, "need at least one mode")
    return tuple(m for m in MODES if m in names)
