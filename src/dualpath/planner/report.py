"""Sweep and ablation reports assembled from ``plan_disagg`` results (docs/planner.md, "Command line" and "JSON").

One process, one memo: identical plan calls (the same model, ratio, budget, overrides, ...) run once
per :class:`PlanCache`, so a figure run that needs the I/O = 100 result for a sweep, a table and the
roofline plot pays for it once. Nothing here mutates a result dict after it is returned by
``plan_disagg``; the reports copy what they need.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dualpath.core.errors import ConfigError, require

if TYPE_CHECKING:
    from dualpath.planner.config import PlanConfig
    from dualpath.planner.plan_store import PlanStore

# The paper's eight models, in the paper's order (`--models all`; docs/planner.md, "Command line").
PAPER_MODELS: tuple[str, ...] = (
    "deepseek-v4-pro",
    "deepseek-v4-flash",
    "llama-3.1-405b",
    "llama-4-maverick",
    "llama-4-scout",
    "glm-4.6",
    "gpt-oss-120b",
    "qwen3-235b-a22b",
)
# The nine swept I/O ratios (the paper's Fig. 5 grid).
SWEEP_RATIOS: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
# Default ablation points (section 8) and the three models the paper ablates.
ABLATION_VALUES: dict[str, tuple[float, ...]] = {
    "kv_width": (128, 512, 1024, 4096),
    "active_experts_x": (1, 2, 4, 8),
    "total_experts_x": (1, 2, 3, 4),
    "ffn_expansion": (1, 2, 4, 8),
    "dtype_bytes": (4, 2, 1, 0.5),
}
ABLATION_MODELS: tuple[str, ...] = ("gpt-oss-120b", "glm-4.6", "deepseek-v4-flash")
ABLATION_IO_RATIO = 100.0
SPLIT_MODES: tuple[str, ...] = ("pd", "af", "pdaf")
# A mode "beats" ND when its throughput exceeds ND's by more than this fraction (float noise only).
BEATS_TOL = 1e-9

Progress = Callable[[str], None]


def ratio_key(ratio: float) -> str:
    """JSON key of an I/O ratio: ``0.01``, ``1``, ``100`` (shortest exact decimal)."""
    return f"{ratio:g}"


def parse_models(text: str | Sequence[str]) -> tuple[str, ...]:
    """``all`` -> the paper's eight; otherwise a comma list, each name checked against the table."""
    from dualpath.spec.models import get_model

    parts = _split(text)
    if parts == ["all"]:
        return PAPER_MODELS
    require(bool(parts), "models", text, "give at least one model name, or 'all'")
    for name in parts:
        get_model(name)  # UnknownNameError naming the value and the choices
    return tuple(parts)


def parse_floats(key: str, text: str | Sequence[str]) -> tuple[float, ...]:
    """A comma list of positive finite numbers; ConfigError naming ``key`` and the bad item."""
    values = []
    for item in _split(text):
        try:
            value = float(item)
        except ValueError:
            raise ConfigError(key, item, "expected a number") from None
        require(math.isfinite(value) and value > 0, key, item, "must be a positive number")
        values.append(value)
    require(bool(values), key, text, "give at least one value")
    return tuple(values)


def _split(text: str | Sequence[str]) -> list[str]:
    items = [text] if isinstance(text, str) else list(text)
    return [p.strip() for item in items for p in item.split(",") if p.strip()]


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def _key(config: PlanConfig) -> tuple:
    return tuple((f.name, _freeze(getattr(config, f.name))) for f in dataclasses.fields(config))


def _plan_group(configs: Sequence[PlanConfig]) -> list[tuple[dict | None, tuple | None, float]]:
    """Plan ``configs`` one after the other in this process (a worker of :meth:`PlanCache.warm`):
    (result, None, seconds) or (None, (key, value, reason) of a budget ConfigError, seconds)."""
    from dualpath.planner.api import plan_disagg

    out: list[tuple[dict | None, tuple | None, float]] = []
    for config in configs:
        started = time.perf_counter()
        try:
            out.append((plan_disagg(config), None, time.perf_counter() - started))
        except ConfigError as exc:  # memoised and raised again where the plan is looked up
            out.append((None, (exc.key, exc.value, exc.reason), time.perf_counter() - started))
    return out


class PlanCache:
    """Memo of ``plan_disagg`` keyed by every field of the config (mutates only its own dict). A
    plan whose budget holds no ND deployment is memoised as its ConfigError, raised again."""

    def __init__(self, store: PlanStore | None = None) -> None:
        self._memo: dict[tuple, dict | ConfigError] = {}
        self.calls = 0  # plans actually run (cache misses)
        self.wall_s = 0.0  # seconds spent in those runs (summed over worker processes)
        self.store = store  # finished plans on disk (plan_store.py), read before planning

    def _load(self, key: tuple) -> bool:
        """Take a stored plan into the memo; True when the store had it."""
        got = self.store.get(key) if self.store is not None else None
        if got is None:
            return False
        res, err = got
        self._memo[key] = res if err is None else ConfigError(*err)  # type: ignore[assignment]
        return True

    def _keep(self, key: tuple, res: dict | None, err: tuple | None) -> None:
        self._memo[key] = res if err is None else ConfigError(*err)  # type: ignore[assignment]
        if self.store is not None:
            self.store.put(key, res, err)

    def __call__(self, config: PlanConfig, progress: Progress | None = None) -> dict:
        key = _key(config)
        if key not in self._memo:
            self._load(key)
        hit = self._memo.get(key)
        if hit is None:
            from dualpath.planner.api import plan_disagg

            started = time.perf_counter()
            try:
                hit = plan_disagg(config, progress=progress)
            except ConfigError as exc:
                self._keep(key, None, (exc.key, exc.value, exc.reason))
                raise
            finally:
                self.wall_s += time.perf_counter() - started
                self.calls += 1
            self._keep(key, hit, None)
        if isinstance(hit, ConfigError):
            raise hit
        return hit

    def warm(
        self, groups: Sequence[Sequence[PlanConfig]], jobs: int = 1, progress: Progress | None = None
    ) -> None:
        """Plan every config of ``groups`` not yet memoised, a group at a time in one process
        (plans of a group share the phase-1 memo), over ``jobs`` processes; the results are the
        same as planning them here one by one (plans are deterministic)."""
        todo = [[c for c in g if _key(c) not in self._memo and not self._load(_key(c))] for g in groups]
        todo = [g for g in todo if g]
        if jobs <= 1:
            for g in todo:
                for config in g:
                    try:
                        self(config)
                    except ConfigError:
                        pass  # memoised: raised again where the plan is looked up
                if progress is not None:
                    progress(f"{g[0].catalog} {g[0].model} I/O={g[0].io_ratio:g} ({len(g)} plans)")
            return
        import concurrent.futures as cf
        import multiprocessing

        # fork where there is one (workers need no re-import of the caller's main module)
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with cf.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context(method)) as pool:
            futures = {pool.submit(_plan_group, g): g for g in todo}
            for fut in cf.as_completed(futures):
                g = futures[fut]
                for config, (res, err, secs) in zip(g, fut.result(), strict=True):
                    self._keep(_key(config), res, err)
                    self.calls += 1
                    self.wall_s += secs
                if progress is not None:
                    progress(f"{g[0].catalog} {g[0].model} I/O={g[0].io_ratio:g} ({len(g)} plans)")


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def _median(values: Iterable[float | None]) -> float | None:
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def _nothing_fits(modes: Sequence[str], reason: str) -> dict:
    """What a plan whose budget holds no ND deployment reports: every mode infeasible."""
    return {
        "best_mode": None,
        "reason": reason,
        "nd_sigma": None,
        "arrival_bound_ceiling": None,
        "context": None,
        "budget": None,
        "modes": {m: {"x_nd": None, "tokens_per_s": None, "pools": [], "feasible": False} for m in modes},
    }


RULE_FIELDS: tuple[str, ...] = (
    "sigma",
    "af_prefill",
    "nd_schedule",
    "budget_anchor",
    "budget_ref_io",
    "shortlist",
    "top_k",
    "num_requests",
    "n2n_gbs",
)


def rules_of(config: PlanConfig) -> dict[str, object]:
    """The rule choices of a report's base config (docs/planner.md, "Rules"), by field name."""
    out: dict[str, object] = {k: getattr(config, k) for k in RULE_FIELDS}
    out["budget_scale"] = config.scale
    out["prices"] = None if config.prices is None else str(config.prices)
    return out


def _regime_of(res: dict) -> dict:
    """The regime entry of one plan: ND's sigma, the arrival bound, the budget and the window."""
    ctx = res.get("context") or {}
    return {
        "nd_sigma": res.get("nd_sigma"),
        "arrival_bound_ceiling": res.get("arrival_bound_ceiling"),
        "budget": (res.get("budget") or {}).get("value"),
        "exceeds_window": ctx.get("exceeds_window"),
        "share_over_window": ctx.get("share_over_window"),
    }


def _ablation_row(model: str, value: float, res: dict) -> dict:
    """One ablation point's row from its plan."""
    prof = res["stage_profile"]
    return {
        "model": model,
        "value": value,
        "x_nd": {
            m: res["modes"][m]["x_nd"] if res["modes"][m].get("feasible", True) else None
            for m in SPLIT_MODES
            if m in res["modes"]
        },
        "best_mode": res["best_mode"],
        "budget": res["budget"],
        "nd_sigma": res["nd_sigma"],
        "arrival_bound_ceiling": res["arrival_bound_ceiling"],
        "da_arithmetic_intensity": prof["da"]["arithmetic_intensity"],
        "da_kv_share": prof["da"]["kv_share"],
        "df_arithmetic_intensity": prof["df"]["arithmetic_intensity"],
    }


def _infeasible_ablation_row(model: str, value: float, modes: Sequence[str], exc: ConfigError) -> dict:
    """The row of an ablation point whose fixed budget holds no ND deployment."""
    return {
        "model": model,
        "value": value,
        "x_nd": {m: None for m in SPLIT_MODES if m in modes},
        "best_mode": None,
        "budget": {"value": exc.value},
        "nd_sigma": None,
        "arrival_bound_ceiling": None,
        "da_arithmetic_intensity": None,
        "da_kv_share": None,
        "df_arithmetic_intensity": None,
        "infeasible": str(exc),
    }


def _add_modes(
    res: dict,
    model: str,
    ratio: float,
    key: str,
    rows: list[dict],
    means: dict[str, dict[str, list[float | None]]],
    counts: dict[str, dict[str, int]],
    allocations: dict[str, list],
) -> None:
    """Append one plan's per-mode rows, x_nd values and tallies (all updated in place)."""
    for mode, rec in res["modes"].items():
        feasible = rec.get("feasible", True)
        x_nd = rec["x_nd"] if feasible else None  # no allocation fits the budget
        best = mode == res["best_mode"]
        rows.append(
            {
                "model": model,
                "io_ratio": ratio,
                "mode": mode,
                "x_nd": x_nd,
                "tokens_per_s": rec["tokens_per_s"] if feasible else None,
                "is_best": best,
                "feasible": feasible,
            }
        )
        means.setdefault(mode, {}).setdefault(key, []).append(x_nd)
        slot = counts.setdefault(mode, {"beats_nd": 0, "best": 0, "infeasible": 0})
        slot["infeasible"] += int(not feasible)
        slot["beats_nd"] += int(mode != "nd" and x_nd is not None and x_nd > 1 + BEATS_TOL)
        slot["best"] += int(best)
        allocations[mode] = rec["pools"]


def sweep(
    base: PlanConfig,
    models: Sequence[str],
    ratios: Sequence[float],
    *,
    cache: PlanCache | None = None,
    progress: Progress | None = None,
) -> dict:
    """The ``sweep --json`` object: every (model, ratio) planned with ``base``'s other fields.

    ``progress`` is called once per finished plan with a short label.
    """
    cache = cache or PlanCache()
    started = time.perf_counter()
    rows: list[dict] = []
    means: dict[str, dict[str, list[float | None]]] = {}
    counts: dict[str, dict[str, dict[str, int]]] = {}
    allocations: dict[str, dict[str, dict[str, list]]] = {}
    regime: dict[str, dict[str, dict]] = {}
    for ratio in ratios:
        key = ratio_key(ratio)
        counts[key] = {m: {"beats_nd": 0, "best": 0, "infeasible": 0} for m in base.modes}
        allocations[key] = {}
        regime[key] = {}
        for model in models:
            try:
                res = cache(dataclasses.replace(base, model=model, io_ratio=float(ratio)))
            except ConfigError as exc:
                if exc.key != "budget":
                    raise
                res = _nothing_fits(base.modes, str(exc))
            allocations[key][model] = {}
            regime[key][model] = _regime_of(res)
            _add_modes(res, model, float(ratio), key, rows, means, counts[key], allocations[key][model])
            if progress is not None:
                progress(f"{base.catalog} {model} I/O={key}")
    return {
        "catalog": base.catalog,
        "models": list(models),
        "io_ratios": [float(r) for r in ratios],
        "budget_scale": base.scale,
        "rules": rules_of(base),
        "rows": rows,
        "model_mean_x_nd": {m: {k: _mean(v) for k, v in by.items()} for m, by in means.items()},
        "model_median_x_nd": {m: {k: _median(v) for k, v in by.items()} for m, by in means.items()},
        "regime": regime,
        "counts": counts,
        "allocations": allocations,
        "wall_s": time.perf_counter() - started,
    }


def ablate(
    base: PlanConfig,
    factor: str,
    values: Sequence[float],
    models: Sequence[str],
    *,
    io_ratio: float = ABLATION_IO_RATIO,
    cache: PlanCache | None = None,
    progress: Progress | None = None,
) -> dict:
    """The ``ablate --json`` object: ``factor`` set to each value, same search and same budget.

    The budget stays the one of the unmodified model (plan_disagg derives it from the model
    before overrides), as the paper keeps its power budget fixed across ablation points.
    """
    require(
        factor in ABLATION_VALUES,
        "factor",
        factor,
        f"unknown ablation factor; choices: {', '.join(ABLATION_VALUES)}",
    )
    cache = cache or PlanCache()
    started = time.perf_counter()
    rows = []
    for model in models:
        for value in values:
            overrides = {**dict(base.overrides), factor: float(value)}
            config = dataclasses.replace(base, model=model, io_ratio=float(io_ratio), overrides=overrides)
            try:
                res = cache(config)
            except ConfigError as exc:
                if exc.key != "budget":
                    raise
                # the fixed budget holds no ND deployment of the modified model: a result too
                rows.append(_infeasible_ablation_row(model, float(value), base.modes, exc))
                if progress is not None:
                    progress(f"{model} {factor}={value:g} (nothing fits the budget)")
                continue
            rows.append(_ablation_row(model, float(value), res))
            if progress is not None:
                progress(f"{model} {factor}={value:g}")
    return {
        "factor": factor,
        "io_ratio": float(io_ratio),
        "models": list(models),
        "values": [float(v) for v in values],
        "rows": rows,
        "wall_s": time.perf_counter() - started,
    }
