"""Unit constants and conversions. Field names carry units (``_bytes``, ``_gbps``, ``_s``)."""

from __future__ import annotations

from dualpath.core.errors import ConfigError

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 1024
MiB = 1024**2
GiB = 1024**3
TFLOP = 1e12
PFLOP = 1e15


def gbps_to_bytes_per_s(gbps: float) -> float:
    """Network line rate in Gbit/s -> bytes/s (decimal, as NIC vendors count)."""
    return gbps * 1e9 / 8.0


def parse_tokens(text: str) -> int:
    """Parse a token count such as ``64k``, ``32K``, ``1m`` or ``4096`` (k = 1024)."""
    raw = text.strip().lower()
    scale = 1
    if raw.endswith("k"):
        raw, scale = raw[:-1], 1024
    elif raw.endswith("m"):
        raw, scale = raw[:-1], 1024 * 1024
    try:
        value = float(raw) * scale
    except ValueError:
        raise ConfigError("tokens", text, "expected a count such as 4096, 32k or 64K") from None
    if value <= 0 or value != int(value):
        raise ConfigError("tokens", text, "must be a positive whole number of tokens")
    return int(value)
