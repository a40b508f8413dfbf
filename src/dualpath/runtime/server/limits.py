"""Value rules of the request edge: every number survives float32 and int64, every string is UTF-8.

The engines sample in float32 and seed ``torch.Generator`` with a 64-bit integer; the cluster's
codec (msgpack) carries integers of at most 64 bits. A value that passes these checks cannot turn
into inf/NaN, 0 or an overflow inside an engine. The rules follow vLLM's ``SamplingParams``:
temperature in [0, 2], below ``GREEDY_BELOW`` it means greedy (argmax), between that and
``MIN_TEMPERATURE`` it is raised to ``MIN_TEMPERATURE`` (``logits / t`` stays finite in float32);
top_p in (0, 1]; seed a signed 64-bit integer. docs/server.md has the table.
"""

from __future__ import annotations

import math
from typing import Any

from dualpath.runtime.server.errors import APIError, bad_param

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
GREEDY_BELOW = 1e-5  # temperature below this is greedy (vLLM's _SAMPLING_EPS)
MIN_TEMPERATURE = 1e-2  # smallest temperature sampled with (vLLM's _MAX_TEMP)
MAX_TEMPERATURE = 2.0
MAX_STOP_TOKEN_IDS = 64
MAX_STOP_STRINGS = 4


def finite_float(
    body: dict[str, Any], key: str, default: float, lo: float, hi: float, *, lo_open: bool = False
) -> float:
    """A finite number in [lo, hi] (or (lo, hi] with ``lo_open``); bools and strings refused."""
    val = body.get(key)
    if val is None:
        return default
    if isinstance(val, bool) or not isinstance(val, (int, float)):
        raise bad_param(key, val, "must be a number")
    try:
        num = float(val)
    except OverflowError:  # an integer beyond float range
        raise bad_param(key, val, f"must be in {'(' if lo_open else '['}{lo}, {hi}]") from None
    if not math.isfinite(num) or not (lo < num if lo_open else lo <= num) or num > hi:
        raise bad_param(key, val, f"must be a finite number in {'(' if lo_open else '['}{lo}, {hi}]")
    return num


def temperature(body: dict[str, Any]) -> float:
    """The temperature the engines use: 0.0 (greedy) or a value in [MIN_TEMPERATURE, 2]."""
    t = finite_float(body, "temperature", 1.0, 0.0, MAX_TEMPERATURE)
    if t < GREEDY_BELOW:
        return 0.0
    return max(t, MIN_TEMPERATURE)


def int64(body: dict[str, Any], key: str) -> int | None:
    """An optional signed 64-bit integer (None if absent)."""
    val = body.get(key)
    if val is None:
        return None
    if isinstance(val, bool) or not isinstance(val, int):
        raise bad_param(key, val, "must be an integer")
    if not INT64_MIN <= val <= INT64_MAX:
        raise bad_param(key, val, f"must be a 64-bit signed integer [{INT64_MIN}, {INT64_MAX}]")
    return val


def token_id_list(body: dict[str, Any], key: str, vocab_size: int) -> tuple[int, ...]:
    """A list of at most MAX_STOP_TOKEN_IDS token ids, each in [0, vocab_size)."""
    ids = body.get(key)
    if ids is None:
        return ()
    if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise bad_param(
            key,
            ids if not isinstance(ids, list) else f"list of {len(ids)} items",
            "must be a list of token ids (integers)",
        )
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise bad_param(key, f"list of {len(ids)} items", f"at most {MAX_STOP_TOKEN_IDS} token ids")
    for t in ids:
        if not 0 <= t < vocab_size:
            raise bad_param(key, t, f"token id out of range [0, {vocab_size})")
    return tuple(ids)


def check_utf8(body: Any) -> None:
    """Refuse strings that cannot be UTF-8 (lone surrogates such as ``"\\ud800"``), naming the
    field path (e.g. ``messages[0].content``). Iterative, so deep nesting cannot recurse."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, val = stack.pop()
        if isinstance(val, str):
            _utf8(path or "body", val)
        elif isinstance(val, dict):
            for k, v in val.items():
                _utf8(f"{path}.{k}" if path else "body key", k)
                stack.append((f"{path}.{k}" if path else str(k), v))
        elif isinstance(val, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(val))


def _utf8(path: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise APIError(
            400,
            f"{path}: invalid unicode (lone surrogate {bad.encode('unicode_escape').decode()!s} "
            f"at character {exc.start}); strings must be valid UTF-8",
            param=path,
            code="invalid_value",
        ) from None
