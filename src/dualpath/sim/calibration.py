"""Every calibration constant of the simulator, in one place, each with its reason.

Fitted ONLY against spec section 10: the DS 660B / 64K / 2P4D offline JCT row (Oracle, DualPath,
Basic at 512..4096 agents), the ablation row at 1,024/2,048 agents and the headline ratios. Every
other published number (other MaxLens, DS 27B, Qwen 32B, online capacity, 48P96D) is a held-out
check reported in docs/sim.md without retuning. Physical quantities (bandwidths, HBM sizes, FLOPs)
are NOT here: they come from ``dualpath.spec``; times of model execution come from ``dualpath.cost``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from dualpath.core.errors import ConfigError
from dualpath.policy import config as _policy_config

# --- scheduling cadence --------------------------------------------------------------------------
# Engine groups fetch work periodically (spec section 3). The paper gives no period; 50 ms is about
# one decode step and short against a ~1 s TTFT. (20 ms changed the 512-agent JCT by < 1% and cost
# 20% more simulation time.)
FETCH_INTERVAL_S = 0.05

# --- storage -------------------------------------------------------------------------------------
# Fraction of the SNIC line rate that storage reads (and writes) achieve end to end. The spec says 3FS
# "saturates a 400 Gbps SNIC"; but Basic's published JCT (10,104 s at 2,048 agents, 64K) implies
# the two PE nodes delivered only ~46 GB/s of hit KV in total (460 TB / 10,104 s), i.e. about half
# of 2 x 50 GB/s. FITTED to the Basic row (1.0 gives Basic 6,658 s, -34%). It also absorbs per-read
# costs we do not model (block lookup, small-read latency, H2D staging in the traffic manager).
STORAGE_EFFICIENCY = 0.5

# Share of each DE node's DRAM buffer kept free of DE-side hit reads, for prefill output streaming
# in (PE-read hits + misses). Without a reserve, a buffer full of read-ahead hits could block the
# output of the very requests holding it. A quarter keeps reads flowing and output unblocked.
DE_OUTPUT_RESERVE = 0.25

# --- HBM -----------------------------------------------------------------------------------------
# Fraction of HBM usable for weights + KV (the rest: activations, CUDA graphs, allocator slack).
# FITTED to Oracle at 2,048-4,096 agents, where JCT is bound by how many requests DE HBM holds:
# 0.85 gave Oracle 3,567 s at 2,048 (paper 4,961). 0.70 of the spec's H100 (85.9 GB) = 60 GB is
# also what an 80 GB H800 (the paper's likely part) leaves after ~20 GB of activations/graphs.
HBM_USABLE_FRACTION = 0.70

# --- parallelism ---------------------------------------------------------------------------------
# Dense (DP) models: one engine is a tensor-parallel group of the smallest TP degree (1, 2, 4, 8) whose
# usable HBM (HBM_USABLE_FRACTION of each GPU, as for every model) holds the weights plus this many
# tokens of KV, i.e. one request at the paper's largest MaxLen (64K). Not fitted. Why TP and not a
# different HBM rule: Qwen2.5-32B's BF16 weights (65 GB) exceed one H100's usable 60 GB, and even the
# whole 85.9 GB leaves 20.9 GB, so any headroom >= 3.7 GB leaves no room for one 64K context
# (64K x 256 KiB = 17.2 GB): on these GPUs "DP" (spec section 9) can only mean DP over TP groups.
# Re-expressing the fraction as a share of HBM after weights cannot keep the DS 660B fit either:
# its PE (EP16, 58.0 GB weights) and DE (EP32, 37.5 GB) would need shares 0.078 and 0.467.
# EP models (DeepSeek) never use TP here, so their results do not depend on this constant.
MIN_KV_TOKENS_PER_ENGINE = 65536
# EP group size in nodes for the DeepSeek models (attention DP inside, lockstep MoE across the
# group). The paper's 2P4D runs one EP group per role; larger clusters are built from such units.
PREFILL_EP_NODES = 2
DECODE_EP_NODES = 4

# --- compute -------------------------------------------------------------------------------------
# Multipliers on the cost model's times (1.0 = the cost model as is). The roofline model is
# optimistic for small EP batches (kernel launch, synchronisation, imbalance across the group).
# FITTED to Oracle at 512 agents (latency bound: the longest trajectory's ~640 turns): decode 2.1x
# gives TPOT ~48 ms at offline load (the paper's online TPOT is 39 ms at 0.4 APS); prefill 1.5x.
PREFILL_TIME_SCALE = 1.5
DECODE_TIME_SCALE = 2.1
# Fixed per-iteration overhead of a PE iteration / DE step (scheduling, launch, sync), seconds.
PREFILL_ITER_OVERHEAD_S = 0.005
DECODE_STEP_OVERHEAD_S = 0.0

# --- PE batching ------------------------------------------------------------------------------
# The paper's compute quota is "300 ms" of predicted attention time. Read per attention LAYER, it
# never binds for agentic turns (one 429-token append over a 32K context costs ~0.7 ms per DS 660B
# layer), and iterations would grow to tens of seconds; read per FORWARD (all layers) it yields
# ~0.5 s iterations of a handful of requests, which is what the paper's TTFTs imply. The policy's
# quota is per forward; the simulator gives it policy.ForwardAttentionPredictor (all layers).
COMPUTE_QUOTA_PER_FORWARD_S = _policy_config.COMPUTE_QUOTA_S

# --- Basic (no layerwise prefill) ----------------------------------------------------------------
# Basic keeps a whole prompt's KV (all layers) in PE HBM, loads it before computing and sends it
# after; the KV room of a PE is its HBM minus weights (HBM_USABLE_FRACTION applies).
# BASIC_READS_NEED_HBM (tried, OFF): a Basic PE read would also start only when that room holds the
# request's whole prompt (held until its prefill is done), so free HBM bounds how far Basic's reads
# run ahead. With STORAGE_EFFICIENCY 0.58 it fits the ablation far better (layerwise step -21.0% vs
# published -17.2%; -4.4% without it) and keeps the 64K row within 8%, but it fails held-out checks:
# Basic/DualPath 2.41x at 32K and 2.08x at 64K (published "up to 1.87x"; 1.85x and 1.94x without
# it) and DS 660B online Basic capacity 0.10 APS (published 0.20; 0.15 without it). See docs/sim.md.
BASIC_READS_NEED_HBM = False

CONSTANTS = {name: value for name, value in dict(globals()).items() if name.isupper()}


# (low, high, low excluded) per constant for --calibrate; the rest must be > 0.
_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "STORAGE_EFFICIENCY": (0.0, 1.0, True),
    "HBM_USABLE_FRACTION": (0.0, 1.0, True),
    "DE_OUTPUT_RESERVE": (0.0, 0.99, False),
    "PREFILL_ITER_OVERHEAD_S": (0.0, math.inf, False),
    "DECODE_STEP_OVERHEAD_S": (0.0, math.inf, False),
}


def current() -> dict[str, object]:
    """Every constant as it stands now (defaults plus any override in force)."""
    module = sys.modules[__name__]
    return {name: getattr(module, name) for name in CONSTANTS}


def parse_overrides(pairs: Iterable[str]) -> dict[str, object]:
    """``["NAME=VALUE", ...]`` -> ``{NAME: value}`` typed like the default; unknown names and
    values that do not parse as that type fail with a ConfigError naming them."""
    out: dict[str, object] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip().upper()
        if not sep or name not in CONSTANTS:
            raise ConfigError("calibrate", pair, "expected NAME=VALUE with NAME one of "
                              + ", ".join(sorted(CONSTANTS)))
        default, text = CONSTANTS[name], text.strip()
        try:
            if isinstance(default, bool):
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(text)
                value: object = text.lower() in ("true", "1")
            elif isinstance(default, int):
                value = int(text)
            else:
                value = float(text)
                if not math.isfinite(value):
                    raise ValueError(text)
        except ValueError:
            kind = {"bool": "true or false", "int": "an integer"}.get(type(default).__name__, "a number")
            raise ConfigError(name, text, f"must be {kind} (default {default!r})") from None
        lo, hi, lo_open = _BOUNDS.get(name, (0.0, math.inf, True))
        if not isinstance(value, bool) and not ((lo < value if lo_open else lo <= value) and value <= hi):  # type: ignore[operator]
            raise ConfigError(name, value, f"must be in {'(' if lo_open else '['}{lo}, {hi}]")
        out[name] = value
    return out


@contextmanager
def overridden(values: dict[str, object]) -> Iterator[dict[str, object]]:
    """Run with these constants changed (see parse_overrides); restores the previous values."""
    module = sys.modules[__name__]
    before = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield current()
    finally:
        for name, value in before.items():
            setattr(module, name, value)
