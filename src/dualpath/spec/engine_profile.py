"""A measured engine profile: step times of one real engine on one machine (a device spec).

An :class:`EngineProfile` holds what profiling our own CPU engine measured (the profiler is
``runtime/engine/step_profile.py``, ``dualpath simulate profile``): a prefill step's seconds on a
grid of ``(cached_len, new_len)`` single-request batches, a decode step's seconds on a grid of
``(batch, context_len)``, a decode engine's admission of a finished prefill (its DE-buffer ->
paged-cache copy) by prompt length, and the attention line the engine's compute quota batches
with. It is saved as JSON (``save`` / ``load`` round-trip it exactly) and read by the simulator's
profile cost model (``cost/profile.py: ProfileTimes``, behind the simulator's ``ProfileCosts``,
``dualpath simulate --device profile:FILE``).

How a step time is read from the grids is ``cost.profile.ProfileTimes``'s (at a grid point, the
measured value). ``batches`` keeps measured multi-request steps that check its batch rule;
nothing is fitted to them.
"""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from dualpath.core.errors import ConfigError

PROFILE_FORMAT = 1
# thread_cpu: CPU seconds of the engine's thread (its cost on an idle core); wall: elapsed seconds
CLOCKS = ("thread_cpu", "wall")


class PrefillPoint(msgspec.Struct, frozen=True, kw_only=True):
    """One measured prefill step of one request: ``new_len`` tokens on ``cached_len`` cached."""

    cached_len: int
    new_len: int
    seconds: float


class DecodePoint(msgspec.Struct, frozen=True, kw_only=True):
    """One measured decode step of ``batch`` requests of ``context_len`` tokens each."""

    batch: int
    context_len: int
    seconds: float


class JoinPoint(msgspec.Struct, frozen=True, kw_only=True):
    """A decode engine admitting one finished prefill of ``prompt_len`` tokens (DE buffer ->
    paged cache, block persistence queued): the time its decode loop spends on it."""

    prompt_len: int
    seconds: float


class BatchPoint(msgspec.Struct, frozen=True, kw_only=True):
    """A measured multi-request prefill step (``entries``: ``[cached_len, new_len]`` each)."""

    entries: tuple[tuple[int, int], ...]
    seconds: float


class EngineProfile(msgspec.Struct, frozen=True, kw_only=True):
    """Step times of one engine on one machine (module docstring). ``prefill`` must cover the
    whole grid of its ``cached_len`` x ``new_len`` values (with ``cached_len`` 0), ``decode`` the
    whole grid of its ``batch`` x ``context_len`` values. ``attention_s_per_gflop`` /
    ``attention_intercept_s``: the whole-forward attention line (``runtime/engine/profile.py``)
    the engine's compute quota batches with. ``num_heads`` / ``head_dim``: the attention shape
    that line's FLOPs are counted on. ``prefill_request_s``: what each request beyond the first
    adds to a prefill step (its own attention calls, staging and sends per layer), measured on a
    batch of equal requests. ``clock``: what the seconds count (``CLOCKS``); ``cpu_cores``: the
    measuring machine's cores; ``max_context_len``: the model's (``max_position_embeddings``),
    which sizes a prefill engine's staging floor (``spec/kv_pools.py``)."""

    format: int = PROFILE_FORMAT
    model: str
    dtype: str
    num_layers: int
    num_heads: int
    head_dim: int
    kv_bytes_per_token: int
    block_size: int
    torch_threads: int
    clock: str  # what a point's seconds count (CLOCKS)
    cpu_cores: int  # of the machine it was measured on (the local cluster's engines share them)
    host: str = ""
    created: str = ""
    max_context_len: int = 0  # the model's longest context (its KV pools' staging floor; 0: unknown)
    attention_s_per_gflop: float
    attention_intercept_s: float = 0.0
    prefill_request_s: float = 0.0  # what each request beyond a step's first adds to it
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]
    join: tuple[JoinPoint, ...] = ()
    batches: tuple[BatchPoint, ...] = ()

    def __post_init__(self) -> None:
        _check(self.format == PROFILE_FORMAT, "format", self.format, f"this version reads {PROFILE_FORMAT}")
        _check(self.clock in CLOCKS, "clock", self.clock, f"choices: {', '.join(CLOCKS)}")
        for key in ("num_layers", "num_heads", "head_dim", "kv_bytes_per_token", "block_size", "cpu_cores"):
            _check(getattr(self, key) > 0, key, getattr(self, key), "must be > 0")
        _check(
            self.attention_s_per_gflop > 0, "attention_s_per_gflop", self.attention_s_per_gflop, "must be > 0"
        )
        _check(self.attention_intercept_s >= 0, "attention_intercept_s", self.attention_intercept_s, ">= 0")
        _check(self.max_context_len >= 0, "max_context_len", self.max_context_len, ">= 0")
        _check(self.prefill_request_s >= 0, "prefill_request_s", self.prefill_request_s, ">= 0")
        points = [(p.cached_len, p.new_len, p.seconds) for p in self.prefill]
        _grid(points, "prefill", (0, 1))
        _grid([(p.batch, p.context_len, p.seconds) for p in self.decode], "decode", (1, 0))
        for p in self.join:
            _check(p.prompt_len > 0 and p.seconds >= 0, "join", p, "prompt_len > 0, seconds >= 0")

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(self), indent=1) + b"\n")

    @classmethod
    def load(cls, path: str | Path) -> EngineProfile:
        """Read a profile file; a missing or malformed file is a ConfigError naming it."""
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise ConfigError("profile", str(p), f"cannot read it: {exc.strerror or exc}") from None
        try:
            return msgspec.json.decode(raw, type=cls)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise ConfigError("profile", str(p), f"not an engine profile: {exc}") from None


def _check(ok: bool, key: str, value: object, why: str) -> None:
    if not ok:
        raise ConfigError(f"profile.{key}", value, why)


def _grid(points: list[tuple[int, int, float]], name: str, mins: tuple[int, int]) -> None:
    """``points`` cover the full grid of their two axes, each axis value >= its minimum."""
    xs = sorted({x for x, _y, _s in points})
    ys = sorted({y for _x, y, _s in points})
    _check(bool(points), name, "[]", "needs at least one point")
    _check(xs[0] >= mins[0] and ys[0] >= mins[1], name, (xs[0], ys[0]), f"axes start at >= {mins}")
    if name == "prefill":
        _check(xs[0] == 0, name, xs[0], "needs cached_len 0 points (the zero-cache step)")
    seen = {(x, y) for x, y, _s in points}
    _check(len(seen) == len(points), name, len(points), "has duplicate points")
    _check(len(seen) == len(xs) * len(ys), name, len(points), f"must fill the {len(xs)} x {len(ys)} grid")
    for x, y, s in points:
        _check(math.isfinite(s) and s >= 0, name, (x, y, s), "seconds must be finite and >= 0")
