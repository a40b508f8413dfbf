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

A row that cannot be predicted raises ConfigError naming the field (one line, the CSV's
``error`` column).
"""

from __future__ import annotations

import math
import re

from dualpath.core.errors import ConfigError
from dualpath.cost.deployment import Deployment, Layout

REQUIRED = ("model_path", "system", "isl", "osl")
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


def deployment_from_row(row: dict[str, str]) -> Deployment:
    """A :class:`Deployment` from one CSV row (ConfigError naming the column that stops it)."""
    for key in REQUIRED:
        if text(row, key) is None:
            raise ConfigError(key, row.get(key, ""), "missing")
    mode = mode_of(row.get("mode") or "agg")
    assumed: list[str] = []
    concurrency = concurrency_of(row, assumed)
    prefill_workers = whole(row, "prefill_num_workers", zero_is_unset=True)
    decode_workers = whole(row, "decode_num_workers", zero_is_unset=True)
    decode_batch = whole(row, "decode_batch_size", zero_is_unset=True)
    prefill_batch = whole(row, "prefill_batch_size", zero_is_unset=True)
    if mode == "disagg":
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
    if concurrency is None:
        raise ConfigError(
            "batch_size",
            row.get("batch_size", ""),
            "missing (and no silicon_concurrency in silicon_data_source)",
        )
    keys = ("precision", "gemm_quant_mode", "moe_quant_mode", "kvcache_quant_mode")
    quant = {k: text(row, k) for k in keys}
    return Deployment(
        model=row["model_path"].strip(),
        system=row["system"].strip(),
        backend=(text(row, "backend") or "trtllm").lower(),
        backend_version=text(row, "backend_version"),
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
    )
