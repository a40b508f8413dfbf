"""Power model of the planner's devices: ``P = P_compute + P_mem`` (heteropanacea.md, Eq. 2).

- ``P_compute = P_ref x (F / F_ref) ^ alpha``: F_ref = H100 BF16 dense (989 TFLOPS), P_ref = H100's
  TDP less its memory power. alpha is fitted by least squares in log space (through the H100 point)
  on three generations of datasheet TDPs, each net of its memory power.
- ``P_mem = e_dyn x bandwidth + p_idle x capacity`` per off-chip memory family: dynamic energy per
  bit at the full bandwidth, plus background (refresh) power per GB. On-chip SRAM takes an on-chip
  estimate instead (heteropanacea.md: not pJ/bit x bandwidth): the power of the SRAM arrays per GB of
  capacity, ``area/GB x power density``, whatever the bandwidth (an SRAM's bandwidth follows from its
  bank count, i.e. from its capacity; its wires are short).

Anchors (copied from ``../shared/data/hardware/aiconfigurator-systems/{a100,h100,b200}_sxm.yaml``,
ai-dynamo/aiconfigurator: ``bfloat16_tc_flops``, ``power``, ``mem_capacity``, ``mem_bw``):

| GPU | BF16 TFLOPS | TDP W | memory | GB | GB/s |
|---|---|---|---|---|---|
| A100 SXM | 312 | 400 | HBM2e | 85.9 (80 GiB) | 2,039 |
| H100 SXM | 989 | 700 | HBM3 | 85.9 (80 GiB) | 3,350 |
| B200 SXM | 2,250 | 1,000 | HBM3e | 193.3 (180 GiB) | 7,700 |

Memory constants (``MEMORY_POWER``); literature values, rounded, each within its published range:

| family | pJ/bit | W/GB idle | source / reason |
|---|---|---|---|
| sram | - | 70 (on-chip) | on-chip estimate: 8e9 bits x 0.021 um2 (TSMC N5 high-density bitcell, IEDM 2019) / 0.6 array efficiency = 280 mm2 per GB, x 0.25 W/mm2 for arrays read at full rate (below logic's 0.5-1 W/mm2) = 70 W/GB; gives 16 W for a Groq-like 230 MB, 140 W for a d-Matrix-like 2 GB |
| hbm | 3.9 | 0.1 | O'Connor et al., MICRO 2017 (HBM2 3.9 pJ/bit, DRAM core + I/O); background ~0.1 W/GB (a 16 GB stack idles at 1-2 W) |
| gddr | 7.5 | 0.3 | GDDR6 ~7.5 pJ/bit (Micron GDDR6X vs GDDR6 energy note; O'Connor 2017 GDDR5 ~14); a 2 GB GDDR6 device idles near 0.5 W |
| lpddr | 4.0 | 0.02 | LPDDR5/5X ~4 pJ/bit (JEDEC LPDDR5 class, O'Connor 2017 LPDDR4 ~4-5); deep self-refresh keeps idle low |
| ddr | 15.0 | 0.15 | DDR4/DDR5 RDIMM access incl. PHY and bus ~15 pJ/bit (O'Connor 2017 DDR4 ~15-20); RDIMM background ~0.1-0.2 W/GB |

With these the fit gives alpha ~0.43 and reproduces the three TDPs within 10% (``power_fit()``;
tests/planner/test_power.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from dualpath.core.errors import require
from dualpath.spec.device import MEMORY_FAMILIES

F_REF_TFLOPS = 989.0  # H100 SXM BF16 dense (h100_sxm.yaml)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPower:
    pj_per_bit: float  # 0 for on-chip SRAM
    idle_w_per_gb: float  # on-chip SRAM: the arrays' whole power per GB
    source: str
    on_chip: bool = False


MEMORY_POWER: dict[str, MemoryPower] = {
    "sram": MemoryPower(
        pj_per_bit=0.0,
        idle_w_per_gb=70.0,
        on_chip=True,
        source="on-chip estimate: 280 mm2/GB (N5 0.021 um2 bitcell / 0.6 array "
        "efficiency) x 0.25 W/mm2 = 70 W/GB, independent of bandwidth",
    ),
    "hbm": MemoryPower(
        pj_per_bit=3.9,
        idle_w_per_gb=0.1,
        source="O'Connor et al. MICRO 2017: HBM2 3.9 pJ/bit; ~0.1 W/GB background",
    ),
    "gddr": MemoryPower(
        pj_per_bit=7.5,
        idle_w_per_gb=0.3,
        source="GDDR6 ~7.5 pJ/bit (Micron; O'Connor 2017 GDDR5 ~14); ~0.3 W/GB idle",
    ),
    "lpddr": MemoryPower(
        pj_per_bit=4.0,
        idle_w_per_gb=0.02,
        source="LPDDR5/5X ~4 pJ/bit (O'Connor 2017 LPDDR4 4-5); self-refresh idle",
    ),
    "ddr": MemoryPower(
        pj_per_bit=15.0,
        idle_w_per_gb=0.15,
        source="DDR4/5 RDIMM ~15 pJ/bit incl. PHY (O'Connor 2017); ~0.15 W/GB idle",
    ),
}
assert set(MEMORY_POWER) == set(MEMORY_FAMILIES)


@dataclass(frozen=True, slots=True, kw_only=True)
class Anchor:
    """One datasheet point of the alpha fit."""

    name: str
    compute_tflops: float
    tdp_w: float
    memory_family: str
    capacity_gb: float
    bandwidth_gbs: float
    source: str


ANCHORS: tuple[Anchor, ...] = (
    Anchor(
        name="a100",
        compute_tflops=312.0,
        tdp_w=400.0,
        memory_family="hbm",
        capacity_gb=85.899,
        bandwidth_gbs=2039.0,
        source="aiconfigurator-systems/a100_sxm.yaml (bfloat16_tc_flops, power, mem_*)",
    ),
    Anchor(
        name="h100",
        compute_tflops=989.0,
        tdp_w=700.0,
        memory_family="hbm",
        capacity_gb=85.899,
        bandwidth_gbs=3350.0,
        source="aiconfigurator-systems/h100_sxm.yaml (bfloat16_tc_flops, power, mem_*)",
    ),
    Anchor(
        name="b200",
        compute_tflops=2250.0,
        tdp_w=1000.0,
        memory_family="hbm",
        capacity_gb=193.274,
        bandwidth_gbs=7700.0,
        source="aiconfigurator-systems/b200_sxm.yaml (bfloat16_tc_flops, power, mem_*)",
    ),
)


def memory_power_w(memory_family: str, capacity_gb: float, bandwidth_gbs: float) -> float:
    """Dynamic energy at full bandwidth plus background power of the capacity (on-chip SRAM:
    its per-GB on-chip estimate only)."""
    require(
        memory_family in MEMORY_POWER, "memory_family", memory_family, f"choices: {', '.join(MEMORY_POWER)}"
    )
    require(capacity_gb > 0, "capacity_gb", capacity_gb, "must be positive")
    require(bandwidth_gbs > 0, "bandwidth_gbs", bandwidth_gbs, "must be positive")
    mem = MEMORY_POWER[memory_family]
    return mem.pj_per_bit * 1e-12 * bandwidth_gbs * 8e9 + mem.idle_w_per_gb * capacity_gb


@dataclass(frozen=True, slots=True, kw_only=True)
class AnchorFit:
    name: str
    datasheet_w: float
    modelled_w: float
    memory_w: float
    rel_error: float  # modelled / datasheet - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PowerFit:
    alpha: float
    p_ref_w: float  # H100 TDP less its memory power
    f_ref_tflops: float
    anchors: tuple[AnchorFit, ...]

    @property
    def max_rel_error(self) -> float:
        return max(abs(a.rel_error) for a in self.anchors)

    def compute_power_w(self, compute_tflops: float) -> float:
        require(compute_tflops > 0, "compute_tflops", compute_tflops, "must be positive")
        return self.p_ref_w * (compute_tflops / self.f_ref_tflops) ** self.alpha

    def to_json(self) -> dict[str, object]:
        return {
            "alpha": self.alpha,
            "p_ref_w": self.p_ref_w,
            "f_ref_tflops": self.f_ref_tflops,
            "max_rel_error": self.max_rel_error,
            "anchors": [
                {
                    "name": a.name,
                    "datasheet_w": a.datasheet_w,
                    "modelled_w": a.modelled_w,
                    "memory_w": a.memory_w,
                    "rel_error": a.rel_error,
                }
                for a in self.anchors
            ],
        }


@lru_cache(maxsize=1)
def power_fit() -> PowerFit:
    """Fit alpha: least squares of ``log(P_net / P_ref) = alpha log(F / F_ref)`` over the anchors."""
    ref = next(a for a in ANCHORS if a.name == "h100")
    p_ref = ref.tdp_w - memory_power_w(ref.memory_family, ref.capacity_gb, ref.bandwidth_gbs)
    xs, ys = [], []
    for a in ANCHORS:
        net = a.tdp_w - memory_power_w(a.memory_family, a.capacity_gb, a.bandwidth_gbs)
        require(net > 0, "anchor", a.name, "memory power exceeds the TDP")
        xs.append(math.log(a.compute_tflops / F_REF_TFLOPS))
        ys.append(math.log(net / p_ref))
    alpha = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    fits = []
    for a in ANCHORS:
        mem = memory_power_w(a.memory_family, a.capacity_gb, a.bandwidth_gbs)
        modelled = p_ref * (a.compute_tflops / F_REF_TFLOPS) ** alpha + mem
        fits.append(
            AnchorFit(
                name=a.name,
                datasheet_w=a.tdp_w,
                modelled_w=modelled,
                memory_w=mem,
                rel_error=modelled / a.tdp_w - 1.0,
            )
        )
    return PowerFit(alpha=alpha, p_ref_w=p_ref, f_ref_tflops=F_REF_TFLOPS, anchors=tuple(fits))


def device_power_w(
    compute_tflops: float, memory_family: str, capacity_gb: float, bandwidth_gbs: float
) -> float:
    """Modelled power of one device: fitted compute power plus its memory's power."""
    return power_fit().compute_power_w(compute_tflops) + memory_power_w(
        memory_family, capacity_gb, bandwidth_gbs
    )
