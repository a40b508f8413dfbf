"""Every calibration constant of the simulator, in one frozen dataclass, each with its reason.

Fitted ONLY against spec section 10: the DS 660B / 64K / 2P4D offline JCT row (Oracle, DualPath,
Basic at 512..4096 agents), the ablation row at 1,024/2,048 agents and the headline ratios. Every
other published number (other MaxLens, DS 27B, Qwen 32B, online capacity, 48P96D) is a held-out
check reported in docs/sim.md without retuning. Physical quantities (bandwidths, HBM sizes, FLOPs)
are NOT here: they come from ``dualpath.spec``; times of model execution come from ``dualpath.cost``.

A run gets its :class:`Calibration` in ``SimConfig.calibration`` (``DEFAULT_CALIBRATION`` unless
given); nothing reads module state. ``--calibrate NAME=VALUE`` builds a replaced copy
(:meth:`Calibration.with_overrides`). Names on the command line and in the JSON output are the
fields in upper case (``STORAGE_EFFICIENCY``), as the docs quote them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from dualpath.core.errors import ConfigError
from dualpath.policy.config import COMPUTE_QUOTA_S


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """The simulator's fitted and chosen constants (see each field's comment for why)."""

    # --- scheduling cadence ----------------------------------------------------------------------
    # Engine groups fetch work periodically (spec section 3). The paper gives no period; 50 ms is
    # about one decode step and short against a ~1 s TTFT. (20 ms changed the 512-agent JCT by < 1%
    # and cost 20% more simulation time.)
    fetch_interval_s: float = 0.05

    # --- storage ---------------------------------------------------------------------------------
    # Fraction of the SNIC line rate that storage reads (and writes) achieve end to end. The spec
    # says 3FS "saturates a 400 Gbps SNIC"; but Basic's published JCT (10,104 s at 2,048 agents,
    # 64K) implies the two PE nodes delivered only ~46 GB/s of hit KV in total (460 TB / 10,104 s),
    # i.e. about half of 2 x 50 GB/s. FITTED to the Basic row (1.0 gives Basic 6,658 s, -34%). It
    # also absorbs per-read costs we do not model (block lookup, small-read latency, H2D staging).
    storage_efficiency: float = 0.5

    # Share of each DE node's DRAM buffer kept free of DE-side hit reads, for prefill output
    # streaming in (PE-read hits + misses). Without a reserve, a buffer full of read-ahead hits
    # could block the output of the very requests holding it. A quarter keeps reads flowing and
    # output unblocked.
    de_output_reserve: float = 0.25

    # --- fixed costs (physical, NOT fitted; docs/fidelity.md) ----------------------------------------
    # Each is a latency a request (or a step) pays on top of what bandwidth and compute give; the
    # comment gives its physical range (also the accepted range, _BOUNDS). Measured effect of each
    # on the published points: docs/fidelity.md.
    # Per-request storage read latency on top of bandwidth (3FS-like: a read's blocks go out in
    # parallel, so the request pays about one storage round trip: metadata lookup + first block
    # over RDMA, ~0.2-1 ms on NVMe-backed 3FS). Range 0-10 ms.
    storage_read_latency_s: float = 0.0005
    # DRAM-buffer allocation of a claim once room is granted (block bookkeeping in a pre-registered
    # pinned pool, no page faults or RDMA registration on the path). Range 0-5 ms.
    buffer_alloc_s: float = 0.0001
    # PD hand-off per request: the PE's "KV complete" message to the DE (one RPC round trip,
    # ~0.1 ms), the DE's HBM block allocation and the posting of the DRAM -> HBM copy of ~500 Full
    # Blocks (spec section 5: ~1 us per RDMA submission, 5-7 us per cudaMemcpyAsync). The DE
    # engine's noticing it at its next step boundary is not in here: the decode unit gives that
    # wait (sim/load_path.py). Not under Oracle (PD transfers bypassed). Range 0-50 ms.
    pd_handoff_s: float = 0.002
    # PD hand-off per layer of layerwise streaming: each layer's "KV loaded / sent" completion
    # (RDMA completion poll + CUDA event) that the next step waits for; paid once per layer of an
    # iteration that moves KV. Range 0-0.5 ms.
    pd_layer_handoff_s: float = 0.00002
    # A request joining a DE's running batch stalls its decode unit: the engine's admission (block
    # table, batch re-formation) -- this constant -- plus the DE-buffer -> HBM copy's HBM writes
    # (prompt KV bytes / HBM bandwidth, derived, not a constant): decode is HBM-bound, so the
    # copy's bytes take that long away from it. The unit's GPUs step in lockstep, so stalls of
    # different GPUs in one step overlap (sim/decode.py charges the largest). The request enters
    # the batch at the next step boundary. Range 0-10 ms.
    decode_join_s: float = 0.0002

    # --- HBM -------------------------------------------------------------------------------------
    # Fraction of HBM usable for weights + KV (the rest: activations, CUDA graphs, allocator slack).
    # FITTED to Oracle at 2,048-4,096 agents, where JCT is bound by how many requests DE HBM holds:
    # 0.85 gave Oracle 3,567 s at 2,048 (paper 4,961). 0.70 of the spec's H100 (85.9 GB) = 60 GB is
    # also what an 80 GB H800 (the paper's likely part) leaves after ~20 GB of activations/graphs.
    # Basic's whole-prompt KV room on a PE is its usable HBM minus weights (see load_path.py; the
    # tried and rejected rule that Basic's reads wait for that room is measured in docs/sim.md).
    hbm_usable_fraction: float = 0.70

    # --- parallelism -----------------------------------------------------------------------------
    # Dense (DP) models: one engine is a tensor-parallel group of the smallest TP degree (1, 2, 4,
    # 8) whose usable HBM (hbm_usable_fraction of each GPU, as for every model) holds the weights
    # plus this many tokens of KV, i.e. one request at the paper's largest MaxLen (64K). Not fitted.
    # Why TP and not a different HBM rule: Qwen2.5-32B's BF16 weights (65 GB) exceed one H100's
    # usable 60 GB, and even the whole 85.9 GB leaves 20.9 GB, so any headroom >= 3.7 GB leaves no
    # room for one 64K context (64K x 256 KiB = 17.2 GB): on these GPUs "DP" (spec section 9) can
    # only mean DP over TP groups. Re-expressing the fraction as a share of HBM after weights cannot
    # keep the DS 660B fit either: its PE (EP16, 58.0 GB weights) and DE (EP32, 37.5 GB) would need
    # shares 0.078 and 0.467. EP models (DeepSeek) never use TP here, so their results do not
    # depend on this constant.
    min_kv_tokens_per_engine: int = 65536
    # EP group size in nodes for the DeepSeek models (attention DP inside, lockstep MoE across the
    # group). The paper's 2P4D runs one EP group per role; larger clusters are built from such units.
    prefill_ep_nodes: int = 2
    decode_ep_nodes: int = 4

    # --- compute ---------------------------------------------------------------------------------
    # Step times come from the cost model as is (``SimConfig.cost_model``: the measured kernel
    # tables by default, sim/costs.py); there is no per-token multiplier. What the per-GPU kernel
    # times leave out is charged here as fixed times, each with its physical range:
    # Host time per PE iteration / DE step that the GPUs wait for (scheduling the batch, input
    # preparation, sampling sync). Prefill: 5 ms (chosen; an iteration plans chunked batches and
    # cannot run as a CUDA graph; range 0-50 ms). Decode: 0.3 ms, an estimate for an overlapped
    # scheduler with CUDA graphs (range 0-5 ms). `plan latency` now uses the measured 0.16 ms
    # (cost/latency_terms.py ITERATION_OVERHEAD_S, vLLM PR #11133); the 0.14 ms difference is
    # 0.3% of a 45 ms decode step, and the given row was fitted with 0.3 ms, so it stays.
    prefill_iter_overhead_s: float = 0.005
    decode_step_overhead_s: float = 0.0003
    # Latency floor of one MoE layer's EP dispatch + combine that the step cannot hide, for an EP
    # group spanning nodes (RDMA): what the bytes do not give (launches, signalling round trips,
    # the wait for the slowest rank). A decode step also pays the bytes, per token of the GPU's
    # batch, over DeepEP's published low-latency bandwidths (sim/ep_comm.py: 3.4 us per token and
    # layer at EP 32, not fitted); PE iterations put their bytes on the CNIC links instead. DeepEP
    # publishes 155 + 273 us at EP 32 and 128 tokens per GPU, which its bandwidths already explain
    # (floor ~0), so what the fit puts here is latency the paper's engine has beyond DeepEP's
    # kernels. Range 50-600 us. FITTED to Oracle at 512 agents on the given row (latency bound, so
    # set by the decode step at 1-2 requests per GPU), with the bytes term and the default
    # pe_scope: 410 us (the fit's steps: docs/notes/sim-calibration.md).
    # Decode's exchange runs DeepEP's low-latency kernels, which in the version whose numbers
    # sim/ep_comm.py uses (docs/legacy.md, "Low-latency kernels with pure RDMA") reach every peer
    # over RDMA, those in the same node too; and what the fit put here is the engine's per-layer
    # cost beyond those kernels' bytes. So a decode step pays it for any EP group, also one inside
    # a node (DS 27B's EP 8 DE; docs/fidelity.md).
    ep_layer_latency_rdma_s: float = 0.00041
    # A PE iteration's exchange (DeepEP's normal kernels) for an EP group inside one node: NVLink,
    # one kernel launch and two barriers per all-to-all. Not fitted (range 10-200 us). DS 27B's
    # 1P1D prefills on EP 8 inside a node.
    ep_layer_latency_nvlink_s: float = 0.00005

    # --- PE batching -----------------------------------------------------------------------------
    # The paper's compute quota is "300 ms" of predicted attention time. Read per attention LAYER,
    # it never binds for agentic turns (one 429-token append over a 32K context costs ~0.7 ms per
    # DS 660B layer), and iterations would grow to tens of seconds; read per FORWARD (all layers) it
    # yields ~0.5 s iterations of a handful of requests, which is what the paper's TTFTs imply. The
    # policy's quota is per forward; the simulator gives it a forward (all-layer) predictor.
    compute_quota_per_forward_s: float = COMPUTE_QUOTA_S  # (policy.config: the one 300 ms)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            lo, hi, lo_open = _BOUNDS.get(f.name, (0.0, math.inf, True))
            if not ((lo < value if lo_open else lo <= value) and value <= hi):
                raise ConfigError(f.name.upper(), value, f"must be in {'(' if lo_open else '['}{lo}, {hi}]")

    def with_overrides(self, pairs: Iterable[str]) -> Calibration:
        """A copy with ``["NAME=VALUE", ...]`` applied (names in any case, values typed like the
        field). Unknown names, values that do not parse and values out of range fail with a
        ConfigError naming them."""
        values: dict[str, Any] = parse_overrides(pairs)
        return replace(self, **values)

    def as_constants(self) -> dict[str, float | int]:
        """``{NAME: value}`` of every constant (upper-case names, for the JSON output)."""
        return {f.name.upper(): getattr(self, f.name) for f in fields(self)}

    def overrides(self) -> dict[str, float | int]:
        """The constants that differ from the defaults, as :meth:`as_constants` names them."""
        base = DEFAULT_CALIBRATION.as_constants()
        return {k: v for k, v in self.as_constants().items() if v != base[k]}


# (low, high, low excluded) per field; the rest must be > 0.
_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "storage_efficiency": (0.0, 1.0, True),
    "hbm_usable_fraction": (0.0, 1.0, True),
    "de_output_reserve": (0.0, 0.99, False),
    "prefill_iter_overhead_s": (0.0, 0.05, False),
    "decode_step_overhead_s": (0.0, 0.005, False),
    "ep_layer_latency_rdma_s": (0.0, 0.0006, False),
    "ep_layer_latency_nvlink_s": (0.0, 0.0002, False),
    "storage_read_latency_s": (0.0, 0.01, False),
    "buffer_alloc_s": (0.0, 0.005, False),
    "pd_handoff_s": (0.0, 0.05, False),
    "pd_layer_handoff_s": (0.0, 0.0005, False),
    "decode_join_s": (0.0, 0.01, False),
}

DEFAULT_CALIBRATION = Calibration()


def parse_overrides(pairs: Iterable[str]) -> dict[str, float | int]:
    """``["NAME=VALUE", ...]`` -> ``{field: value}`` typed like the default (range checks happen
    when the Calibration is built); unknown names and unparsable values raise ConfigError."""
    defaults = {f.name: getattr(DEFAULT_CALIBRATION, f.name) for f in fields(Calibration)}
    out: dict[str, float | int] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        key = name.strip().lower()
        if not sep or key not in defaults:
            raise ConfigError(
                "calibrate",
                pair,
                "expected NAME=VALUE with NAME one of " + ", ".join(sorted(k.upper() for k in defaults)),
            )
        default, text = defaults[key], text.strip()
        try:
            value: float | int = int(text) if isinstance(default, int) else float(text)
            if not math.isfinite(value):
                raise ValueError(text)
        except ValueError:
            kind = "an integer" if isinstance(default, int) else "a number"
            raise ConfigError(key.upper(), text, f"must be {kind} (default {default!r})") from None
        out[key] = value
    return out
