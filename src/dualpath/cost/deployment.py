"""One deployment to predict (model, system, backend, precision, mode, lengths, layouts) and the
prediction, with the system's kernel tables opened once per process.

Field names follow AIConfigurator's silicon-measurement columns without ``_size`` (``tp`` for
``tp_size``, ``prefill_workers`` for ``prefill_num_workers``); ``batch_size`` is the client
concurrency. Layout fields left None take defaults: ``pp``/``attention_dp`` 1; experts
``moe_tp = tp x attention_dp`` when neither ``moe_tp`` nor ``moe_ep`` is given (pure TP MoE), else
the missing one so that ``moe_tp x moe_ep = tp x attention_dp`` (both 1 on a multi-GPU replica,
as CSVs write dense rows, count as not set). Two conventions for attention DP
are accepted: AIConfigurator's (``tp`` is the attention TP, a replica has ``tp x attention_dp`` GPUs)
and TensorRT-LLM's (``tp_size`` is the world and attention DP splits it: ``--tp 8
--attention-dp 8 --moe-ep 8`` is 8 GPUs). The second is read when ``attention_dp`` divides ``tp``
and the given expert sizes multiply to ``tp`` rather than to ``tp x attention_dp``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from dualpath.core.errors import ConfigError, require
from dualpath.cost.forward import Forward
from dualpath.cost.kernels import KernelTables
from dualpath.cost.latency import Pool, Prediction, predict_disagg
from dualpath.cost.latency_agg import predict_agg
from dualpath.cost.latency_terms import BACKENDS, Parallel, Precision
from dualpath.cost.tables import resolve_data_dir
from dualpath.spec.models import get_model
from dualpath.spec.systems import get_system

MODES = ("agg", "disagg")
_KERNELS: dict[tuple[str, str], KernelTables] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Parallel sizes as given (None = default, see the module doc)."""

    tp: int | None = None
    pp: int | None = None
    attention_dp: int | None = None
    moe_tp: int | None = None
    moe_ep: int | None = None

    def resolve(self, prefix: str = "") -> Parallel:
        tp, pp, dp = self.tp or 1, self.pp or 1, self.attention_dp or 1
        moe_tp, moe_ep = self.moe_tp, self.moe_ep
        experts = (moe_tp or 1) * (moe_ep or 1)
        if dp > 1 and tp % dp == 0 and experts == tp and tp * dp != experts:
            tp //= dp  # TensorRT-LLM's convention: tp_size is the world, attention DP splits it
        gpus = tp * dp
        if (moe_tp, moe_ep) == (1, 1) and gpus > 1:
            moe_tp = moe_ep = None  # a CSV's 1 / 1 on a multi-GPU replica means "not set"
        if moe_tp is None and moe_ep is None:
            moe_tp, moe_ep = gpus, 1
        elif moe_tp is None and moe_ep is not None:
            require(gpus % moe_ep == 0, f"{prefix}moe_ep", moe_ep, f"must divide tp x attention_dp = {gpus}")
            moe_tp = gpus // moe_ep
        elif moe_ep is None and moe_tp is not None:
            require(gpus % moe_tp == 0, f"{prefix}moe_tp", moe_tp, f"must divide tp x attention_dp = {gpus}")
            moe_ep = gpus // moe_tp
        assert moe_tp is not None and moe_ep is not None
        return Parallel(tp=tp, pp=pp, attention_dp=dp, moe_tp=moe_tp, moe_ep=moe_ep)


@dataclass(frozen=True, slots=True, kw_only=True)
class Deployment:
    """What ``dualpath plan latency`` predicts (one CLI call or one CSV row)."""

    model: str
    system: str
    backend: str = "trtllm"
    backend_version: str | None = None  # selects the scheduler defaults (dualpath.latency)
    precision: str | None = None
    gemm_quant_mode: str | None = None
    moe_quant_mode: str | None = None
    kv_dtype: str | None = None
    mode: str = "agg"
    isl: int = 1024
    osl: int = 128
    batch_size: float = 1
    layout: Layout = Layout()
    prefill_batch: int | None = None  # None: 1 in closed form; the backend's own limit simulated
    prefill_workers: int = 1
    prefill: Layout = Layout()
    decode_batch: int | None = None
    decode_workers: int = 1
    decode: Layout = Layout()
    assumed: tuple[str, ...] = ()  # what a CSV row left empty and was derived (cli/plan_latency.py)

    def __post_init__(self) -> None:
        require(self.mode in MODES, "mode", self.mode, f"choices: {', '.join(MODES)}")
        require(self.backend in BACKENDS, "backend", self.backend, f"choices: {', '.join(BACKENDS)}")


def precision_in_name(name: str) -> str | None:
    """The precision a quantised re-release's name carries (``nvidia/Llama-3.1-8B-Instruct-FP8``:
    fp8, ``...-FP4`` / ``-NVFP4``: nvfp4), for rows that give no precision; else None."""
    tail = name.strip().rstrip("/").split("/")[-1].lower()
    if tail.endswith(("-fp4", "-nvfp4", "-fp4-v2")):
        return "nvfp4"
    if tail.endswith(("-fp8", "-fp8-dynamic")):
        return "fp8"
    return None


def kernels_for(system: str, data_dir: str | Path | None = None) -> KernelTables:
    """The kernel tables of ``system`` (cached per process and data folder)."""
    spec = get_system(system)
    key = (spec.name, str(resolve_data_dir(data_dir)))
    if key not in _KERNELS:
        _KERNELS[key] = KernelTables.load(spec, data_dir)
    return _KERNELS[key]


def forward_for(dep: Deployment, data_dir: str | Path | None = None):  # type: ignore[no-untyped-def]
    """``(kernels, forward(layout, prefix) -> Forward)`` for ``dep``'s model, system and precision."""
    model = get_model(dep.model)
    kernels = kernels_for(dep.system, data_dir)
    precision = dep.precision
    if not (precision or dep.gemm_quant_mode or dep.moe_quant_mode):
        precision = precision_in_name(dep.model)
    prec = Precision.resolve(
        model, precision, gemm=dep.gemm_quant_mode, moe=dep.moe_quant_mode, kv=dep.kv_dtype
    )

    def forward(layout: Layout, prefix: str) -> Forward:
        return Forward(
            kernels=kernels, model=model, par=layout.resolve(prefix), prec=prec, backend=dep.backend
        )

    return kernels, forward


def predict(dep: Deployment, data_dir: str | Path | None = None) -> Prediction:
    """TTFT / TPOT of ``dep`` in closed form (the steady state); ConfigError naming the value
    that does not fit. dualpath.latency simulates the benchmark instead."""
    kernels, forward = forward_for(dep, data_dir)
    if dep.mode == "agg":
        pred = predict_agg(forward(dep.layout, ""), isl=dep.isl, osl=dep.osl, concurrency=dep.batch_size)
        return replace(pred, tables=kernels.describe())
    if dep.prefill.tp is None and dep.decode.tp is None:
        raise ConfigError("prefill_tp", None, "disagg mode needs --prefill-tp and --decode-tp")
    decode_batch = dep.decode_batch or max(1, round(dep.batch_size / dep.decode_workers))
    pred = predict_disagg(
        Pool(fw=forward(dep.prefill, "prefill_"), batch=dep.prefill_batch or 1, workers=dep.prefill_workers),
        Pool(fw=forward(dep.decode, "decode_"), batch=decode_batch, workers=dep.decode_workers),
        isl=dep.isl,
        osl=dep.osl,
        concurrency=dep.batch_size,
    )
    return replace(pred, tables=kernels.describe())
