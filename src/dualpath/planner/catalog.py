"""The planner's two design spaces: custom NPUs (power budget) and commercial GPUs (USD/hour).

**NPU catalogue**: every compute tier x every memory point is one ``spec.device.DeviceSpec``;
compute is precision independent. Memory points (GB, GB/s), each anchored on a real part:

| family | point | anchor |
|---|---|---|
| sram | (0.23, 80,000) | Groq LPU: 230 MB on-die SRAM at 80 TB/s |
| sram | (2, 150,000) | d-Matrix Corsair: 2 GB SRAM at 150 TB/s |
| hbm | (16, 1,000) | one HBM2 generation (V100 16 GB 900 GB/s, MI50 16 GB 1 TB/s) |
| hbm | (80, 3,350) | H100 SXM (HBM3) |
| hbm | (141, 4,800) | H200 (HBM3e) |
| hbm | (190, 8,000) | B200 class (HBM3e, 180-192 GB, 8 TB/s) |
| gddr | (24, 1,008) | RTX 4090 (GDDR6X) |
| gddr | (48, 864) | L40S (GDDR6) |
| lpddr | (32, 200) | Apple M1 Pro class (LPDDR5, 200 GB/s) |
| lpddr | (128, 546) | Apple M4 Max (LPDDR5X, 546 GB/s) |
| lpddr | (480, 512) | NVIDIA Grace (LPDDR5X, 480 GB, 512 GB/s) |
| ddr | (256, 307) | one socket, 8 x DDR5-4800 channels |
| ddr | (1,024, 614) | two sockets, 16 x DDR5-4800 channels |

Compute tiers (TFLOPS): 25, 100, 250, 2,500, 10,000, 20,000 (the planner's defaults, spanning an edge
NPU to a wafer-scale part). An NPU's power is the fitted model (planner/power.py); its price is
undefined. **GPU catalogue**: datasheet BF16 dense TFLOPS (spec/hardware.py, sources there), the
datasheet TDP as power, and a dated USD/hour price (``gpu_prices.json``, overridable).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from dualpath.core.errors import ConfigError, UnknownNameError, require
from dualpath.planner.power import MEMORY_POWER, device_power_w, memory_power_w, power_fit
from dualpath.spec.device import Device, DeviceSpec, npu_name
from dualpath.spec.hardware import GPUSpec, get_gpu

CatalogName = Literal["npu", "gpu"]
BudgetKind = Literal["power_w", "usd_per_hr"]
CATALOGS = ("npu", "gpu")
NPU_COMPUTE_TIERS_TFLOPS = (25.0, 100.0, 250.0, 2500.0, 10000.0, 20000.0)
NPU_MEMORY_POINTS: tuple[tuple[str, float, float], ...] = (
    ("sram", 0.23, 80000.0),
    ("sram", 2.0, 150000.0),
    ("hbm", 16.0, 1000.0),
    ("hbm", 80.0, 3350.0),
    ("hbm", 141.0, 4800.0),
    ("hbm", 190.0, 8000.0),
    ("gddr", 24.0, 1008.0),
    ("gddr", 48.0, 864.0),
    ("lpddr", 32.0, 200.0),
    ("lpddr", 128.0, 546.0),
    ("lpddr", 480.0, 512.0),
    ("ddr", 256.0, 307.0),
    ("ddr", 1024.0, 614.0),
)
GPU_CATALOG = ("h100", "a100", "a100-40gb", "l40s", "l4", "a10g", "t4", "v100", "m60")
PRICES_FILE = Path(__file__).with_name("gpu_prices.json")


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogDevice:
    """One candidate device with what a budget counts: power (NPU) or price (GPU)."""

    device: Device
    kind: Literal["npu", "gpu"]
    power_w: float
    usd_per_hr: float | None  # GPUs only

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def compute_tflops(self) -> float:
        return self.device.peak_flops(16) / 1e12

    @property
    def memory(self) -> str:
        d = self.device
        return d.memory_family if isinstance(d, DeviceSpec) else getattr(d, "memory", "hbm")

    @property
    def capacity_gb(self) -> float:
        return self.device.capacity_bytes / 1e9

    @property
    def bandwidth_gbs(self) -> float:
        return self.device.mem_bytes_per_s / 1e9

    def cost(self, budget_kind: BudgetKind) -> float:
        """What one device costs against a ``power_w`` or ``usd_per_hr`` budget."""
        if budget_kind == "power_w":
            return self.power_w
        if budget_kind == "usd_per_hr":
            if self.usd_per_hr is None:
                raise ConfigError("budget_kind", budget_kind, f"{self.name} has no price")
            return self.usd_per_hr
        raise UnknownNameError("budget kind", str(budget_kind), ("power_w", "usd_per_hr"))

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "compute_tflops": self.compute_tflops,
            "memory": self.memory,
            "capacity_gb": self.capacity_gb,
            "bandwidth_gbs": self.bandwidth_gbs,
        }


@lru_cache(maxsize=1)
def npu_catalog() -> tuple[CatalogDevice, ...]:
    """Every compute tier x every memory point (78 devices), compute-major."""
    out = []
    for tflops in NPU_COMPUTE_TIERS_TFLOPS:
        for family, gb, gbs in NPU_MEMORY_POINTS:
            dev = DeviceSpec(
                name=npu_name(tflops, family, gb),
                compute_tflops=tflops,
                memory_family=family,
                capacity_gb=gb,
                bandwidth_gbs=gbs,
            )
            out.append(
                CatalogDevice(
                    device=dev, kind="npu", usd_per_hr=None, power_w=device_power_w(tflops, family, gb, gbs)
                )
            )
    return tuple(out)


def load_prices(prices: Path | None = None) -> dict[str, float]:
    """USD/hour per catalogue GPU: the shipped list, with ``prices`` (a JSON file mapping GPU ->
    USD/hour, or ``{"prices": {gpu: {"instance_usd_per_hr", "gpus"} | usd}}``) overriding it."""
    table = {k: v for k, v in _read_prices(PRICES_FILE).items()}
    if prices is not None:
        require(Path(prices).is_file(), "prices", str(prices), "file not found")
        for name, value in _read_prices(Path(prices)).items():
            if name not in GPU_CATALOG:
                raise UnknownNameError("gpu", name, GPU_CATALOG)
            table[name] = value
    return table


def _read_prices(path: Path) -> dict[str, float]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError("prices", str(path), f"unreadable JSON: {exc}") from None
    require(isinstance(raw, dict), "prices", str(path), "must be a JSON object")
    entries = raw.get("prices", raw)
    require(isinstance(entries, dict), "prices", str(path), "'prices' must be an object")
    out: dict[str, float] = {}
    for name, entry in entries.items():
        if isinstance(entry, dict):
            value = entry.get("usd_per_hr")
            if value is None and "instance_usd_per_hr" in entry:
                value = entry["instance_usd_per_hr"] / entry.get("gpus", 1)
        else:
            value = entry
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        require(ok, f"prices.{name}", value, "must be a positive USD/hour")
        out[str(name)] = float(value)  # type: ignore[arg-type]
    return out


def gpu_catalog(prices: Path | None = None) -> tuple[CatalogDevice, ...]:
    table = load_prices(prices)
    out = []
    for name in GPU_CATALOG:
        gpu: GPUSpec = get_gpu(name)
        require(name in table, "prices", name, "no price for this catalogue GPU")
        out.append(CatalogDevice(device=gpu, kind="gpu", power_w=gpu.tdp_w, usd_per_hr=table[name]))
    return tuple(out)


def catalog(name: str, prices: Path | None = None) -> tuple[CatalogDevice, ...]:
    if name == "npu":
        return npu_catalog()
    if name == "gpu":
        return gpu_catalog(prices)
    raise UnknownNameError("catalog", name, CATALOGS)


def catalog_report(name: str, prices: Path | None = None) -> dict[str, object]:
    """The ``plan disagg catalog --json`` object: the power fit, memory constants, every device
    with its power (NPU: modelled; GPU: datasheet TDP next to the modelled value) and price."""
    devices = catalog(name, prices)
    fit = power_fit()
    rows = []
    for d in devices:
        row: dict[str, object] = {**d.to_json(), "power_w": d.power_w, "usd_per_hr": d.usd_per_hr}
        if d.kind == "gpu":
            mem = memory_power_w(d.memory, d.capacity_gb, d.bandwidth_gbs)
            modelled = fit.compute_power_w(d.compute_tflops) + mem
            row.update(
                datasheet_tdp_w=d.power_w,
                modelled_power_w=modelled,
                memory_power_w=mem,
                power_rel_error=modelled / d.power_w - 1.0,
            )
        rows.append(row)
    report: dict[str, object] = {
        "catalog": name,
        "efficiency_default": "ideal",
        "alpha": fit.alpha,
        "p_ref_w": fit.p_ref_w,
        "f_ref_tflops": fit.f_ref_tflops,
        "fit_max_rel_error": fit.max_rel_error,
        "power_fit": fit.to_json(),
        "memory_power": {
            k: {
                "pj_per_bit": v.pj_per_bit,
                "idle_w_per_gb": v.idle_w_per_gb,
                "on_chip": v.on_chip,
                "source": v.source,
            }
            for k, v in MEMORY_POWER.items()
        },
        "devices": rows,
    }
    if name == "gpu":
        shipped = json.loads(PRICES_FILE.read_text(encoding="utf-8"))
        report["prices"] = {
            "source": shipped["source"],
            "date": shipped["date"],
            "override": None if prices is None else str(prices),
        }
    else:
        report["compute_tiers_tflops"] = list(NPU_COMPUTE_TIERS_TFLOPS)
        report["memory_points"] = [
            {"memory": f, "capacity_gb": gb, "bandwidth_gbs": gbs} for f, gb, gbs in NPU_MEMORY_POINTS
        ]
    return report
