"""Rows of AIConfigurator's silicon-measurement CSV layout as deployments to simulate.

Columns: ``model_path, system, backend, backend_version, precision, mode, isl, osl,
gemm_quant_mode, moe_quant_mode, kvcache_quant_mode, batch_size, tp_size, pp_size,
attention_dp_size, moe_tp_size, moe_ep_size`` and the ``prefill_*`` / ``decode_*`` layout columns
with ``*_batch_size`` and ``*_num_workers``; ``silicon_data_source`` and ``id`` are read for what a
row leaves empty. ``nan`` / ``none`` / ``null`` cells count as empty, and so does a parallel width
of 0 (as the layout's own tools write an unset width).

What a row leaves empty is derived from what the measurement implies and listed in ``assumed``
(the CSV's ``assumed`` column), not refused:

- the client concurrency: ``batch_size``, else the ``silicon_concurrency=N`` of
  ``silicon_data_source``, else the ``_cN_`` of ``id``, else (disaggregated) decode batch x
  decode workers;
- disaggregated worker counts: 1 prefill and 1 decode worker of the row's widths (the GPUs the
  layout names);
- the decode batch: the concurrency over the decode workers; the prefill batch: the backend's own
  limit (its token budget and running-request cap).

**Engine limits** (``limits``): ``backend`` runs every row under its backend's documented defaults
(latency/defaults.py); ``aiconfigurator`` under the limits AIConfigurator's generator writes into
the configs it deploys (``aiconfigurator_limits``); ``auto`` (the default) takes the generated
limits for the vLLM and TensorRT-LLM rows of AIConfigurator's own gap-analysis collection
(``silicon_data_source`` names ``aic-auto-gap-analysis``) and the backend defaults for every other
row. That is an inference, stated as one (``GENERATED_BACKENDS``): the collection is
AIConfigurator's automated measurement of the configs it generates (its generator ships the
engine rules, ``generator/rule_plugin/*.rule``, and the benchmark, ``bench_run.sh.j2``: aiperf over
a concurrency sweep), and the rows carry the generated budget's signature. vLLM: the staggered,
one-prompt-per-iteration schedule of ``max_num_batched_tokens = batch + isl + 1500`` (TTFT flat in
the concurrency up to 32 clients, TPOT carrying the others' prefills). TensorRT-LLM: TTFT at
fixed concurrency extrapolated to no output (its intercept over osl 128 / 256 / 512) is what one
prompt per iteration under ``max_num_tokens = batch + isl + 500`` gives (Llama-3.1-8B TP1, 8
clients of 1024 tokens: 71 ms measured, 68 ms simulated, 176 ms under the 8192-token default;
Qwen3-235B-A22B TP4, 16 clients of 1024: 217 / 219 / 455 ms). The collection's SGLang rows
contradict their generated limits (its synchronised rounds are impossible with the generated
``enable_mixed_chunk``), so they keep the backend defaults.

**The benchmark client.** Rows whose ``silicon_data_source`` names a dated collection file
(``source_file=2026-03-25.csv``) carry InferenceMAX's grid (isl / osl 1024 / 1024, 1024 / 8192,
8192 / 1024, concurrency 4-64, its models); its client (SemiAnalysis InferenceMAX README: vLLM's
``benchmark_serving.py``, random dataset, ``--random-range-ratio 0.8``, ``--num-prompts conc x 10``,
``--ignore-eos``, ``--max-concurrency conc``) draws prompt and output lengths uniformly from
``[int(0.8 x n), n]`` (that script's ``sample_random_requests``: ``randint(int(len x ratio), len +
1)``), so those rows are simulated with ``length_range_ratio = 0.8`` (and say so in ``assumed``);
every other row with fixed lengths (AIConfigurator's and Dynamo's aiperf runs: ``--isl-stddev
0``). The client and its ratio are documented; that these rows are InferenceMAX runs is inferred
from their grid (the rows do not name their client).

A row that cannot be predicted raises ConfigError naming the field (one line, the CSV's
``error`` column).
"""

from __future__ import annotations

import math
import re

from dualpath.core.errors import ConfigError
from dualpath.cost.deployment import Deployment, Layout

REQUIRED = ("model_path", "system", "isl", "osl")
LIMIT_CHOICES = ("auto", "backend", "aiconfigurator")
AIC_COLLECTION = "aic-auto-gap-analysis"
GENERATED_BACKENDS = ("vllm", "trtllm")  # the collection's backends that ran the generated limits
INFERENCEMAX_SOURCE = re.compile(r"source_file=\d{4}-\d{2}-\d{2}\.csv")
INFERENCEMAX_RANGE_RATIO = 0.8
EMPTY = ("", "nan", "none", "null")


def text(row: dict[str, str], key: str) -> str | None:
    raw = (row.get(key) or "").strip()
    return None if raw.lower() in EMPTY else raw


def whole(row: dict[str, str], key: str, *, zero_is_unset: bool = False) -> int | None:
    """``row[key]`` as a whole number (None when empty; ConfigError naming the column)."""
    raw = text(row, key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(key, raw, "must be a whole number") from None
    if value != int(value) or value < 0:
        raise ConfigError(key, raw, "must be a whole number >= 0")
    if value == 0 and zero_is_unset:
        return None
    return int(value)


def mode_of(raw: str) -> str:
    word = raw.strip().lower()
    return "disagg" if word.startswith("disag") else "agg" if word.startswith("ag") else word


def _layout(row: dict[str, str], prefix: str) -> Layout:
    def width(key: str) -> int | None:
        return whole(row, f"{prefix}{key}", zero_is_unset=True)

    return Layout(
        tp=width("tp_size"),
        pp=width("pp_size"),
        attention_dp=width("attention_dp_size"),
        moe_tp=width("moe_tp_size"),
        moe_ep=width("moe_ep_size"),
    )


def concurrency_of(row: dict[str, str], assumed: list[str]) -> int | None:
    """The client concurrency the row measured (see the module doc), or None."""
    given = whole(row, "batch_size", zero_is_unset=True)
    if given is not None:
        return given
    source = row.get("silicon_data_source") or ""
    found = re.search(r"silicon_concurrency\s*=\s*(\d+)", source)
    if found:
        assumed.append(f"concurrency {found.group(1)} from silicon_data_source")
        return int(found.group(1))
    found = re.search(r"_c(\d+)_", row.get("id") or "")
    if found:
        assumed.append(f"concurrency {found.group(1)} from id")
        return int(found.group(1))
    return None


def limits_of(row: dict[str, str], backend: str, limits: str) -> str:
    """The engine limits a row is simulated under (see the module doc)."""
    if limits not in LIMIT_CHOICES:
        raise ConfigError("limits", limits, f"choices: {', '.join(LIMIT_CHOICES)}")
    if limits != "auto":
        return limits
    generated = backend in GENERATED_BACKENDS and AIC_COLLECTION in (row.get("silicon_data_source") or "")
    return "aiconfigurator" if generated else "backend"


def _check_required(row: dict[str, str]) -> None:
    for key in REQUIRED:
        if text(row, key) is None:
            raise ConfigError(key, row.get(key, ""), "missing")


def _disagg_defaults(
    concurrency: int | None,
    workers: tuple[int | None, int | None],
    batches: tuple[int | None, int | None],
    assumed: list[str],
) -> tuple[int | None, int, int, int | None]:
    """Fill a disagg row's unset workers / batch / concurrency; returns them, noting each guess."""
    prefill_workers, decode_workers = workers
    prefill_batch, decode_batch = batches
    if prefill_workers is None:
        prefill_workers = 1
        assumed.append("1 prefill worker")
    if decode_workers is None:
        decode_workers = 1
        assumed.append("1 decode worker")
    if concurrency is None and decode_batch is not None:
        concurrency = decode_batch * decode_workers
        assumed.append(f"concurrency {concurrency} = decode batch x decode workers")
    if decode_batch is None and concurrency is not None:
        decode_batch = max(1, math.ceil(concurrency / decode_workers))
        assumed.append(f"decode batch {decode_batch} = concurrency / decode workers")
    if prefill_batch is None:
        assumed.append("prefill batch: the backend's own limit")
    return concurrency, prefill_workers, decode_workers, decode_batch


def _chosen_limits(row: dict[str, str], backend: str, limits: str, assumed: list[str]) -> str:
    chosen = limits_of(row, backend, limits)
    if chosen == "aiconfigurator" and limits == "auto":
        assumed.append(
            f"engine limits: AIConfigurator-generated (a {backend} row of its gap-analysis collection)"
        )
    return chosen


def _length_ratio(row: dict[str, str], assumed: list[str]) -> float:
    if INFERENCEMAX_SOURCE.search(row.get("silicon_data_source") or ""):
        assumed.append("benchmark: InferenceMAX's client, lengths uniform in [0.8, 1] x isl / osl")
        return INFERENCEMAX_RANGE_RATIO
    return 1.0


def deployment_from_row(row: dict[str, str], limits: str = "auto") -> Deployment:
    """A :class:`Deployment` from one CSV row (ConfigError naming the column that stops it)."""
    _check_required(row)
    mode = mode_of(row.get("mode") or "agg")
    assumed: list[str] = []
    concurrency = concurrency_of(row, assumed)
    prefill_workers = whole(row, "prefill_num_workers", zero_is_unset=True)
    decode_workers = whole(row, "decode_num_workers", zero_is_unset=True)
    decode_batch = whole(row, "decode_batch_size", zero_is_unset=True)
    prefill_batch = whole(row, "prefill_batch_size", zero_is_unset=True)
    if mode == "disagg":
        concurrency, prefill_workers, decode_workers, decode_batch = _disagg_defaults(
            concurrency, (prefill_workers, decode_workers), (prefill_batch, decode_batch), assumed
        )
    if concurrency is None:
        raise ConfigError(
            "batch_size",
            row.get("batch_size", ""),
            "missing (and no silicon_concurrency in silicon_data_source)",
        )
    keys = ("precision", "gemm_quant_mode", "moe_quant_mode", "kvcache_quant_mode")
    quant = {k: text(row, k) for k in keys}
    backend = (text(row, "backend") or "trtllm").lower()
    chosen = _chosen_limits(row, backend, limits, assumed)
    ratio = _length_ratio(row, assumed)
    return Deployment(
        model=row["model_path"].strip(),
        system=row["system"].strip(),
        backend=backend,
        backend_version=text(row, "backend_version"),
        limits=chosen,
        mode=mode,
        precision=quant["precision"],
        gemm_quant_mode=quant["gemm_quant_mode"],
        moe_quant_mode=quant["moe_quant_mode"],
        kv_dtype=quant["kvcache_quant_mode"],
        isl=whole(row, "isl") or 0,
        osl=whole(row, "osl") or 0,
        batch_size=concurrency,
        layout=_layout(row, ""),
        prefill_batch=prefill_batch,
        prefill_workers=prefill_workers or 1,
        prefill=_layout(row, "prefill_"),
        decode_batch=decode_batch,
        decode_workers=decode_workers or 1,
        decode=_layout(row, "decode_"),
        assumed=tuple(assumed),
        length_range_ratio=ratio,
    )
