"""Every calibration constant of the simulator, in one place, each with its reason.

Fitted ONLY against spec section 10: the DS 660B / 64K / 2P4D offline JCT row (Oracle, DualPath,
Basic at 512..4096 agents), the ablation row at 1,024/2,048 agents and the headline ratios. Every
other published number (other MaxLens, DS 27B, Qwen 32B, online capacity, 48P96D) is a held-out
check reported in docs/sim.md without retuning. Physical quantities (bandwidths, HBM sizes, FLOPs)
are NOT here: they come from ``dualpath.spec``; times of model execution come from ``dualpath.cost``.
"""

from __future__ import annotations

# --- scheduling cadence --------------------------------------------------------------------------
# Engine groups fetch work periodically (spec section 3). The paper gives no period; 20 ms is short
# against a 300 ms prefill quota and a ~40 ms decode step, and long enough to batch arrivals.
FETCH_INTERVAL_S = 0.02

# --- storage -------------------------------------------------------------------------------------
# 3FS "saturates a 400 Gbps SNIC" (spec section 3). Reads are of 64-token Full Blocks (2.5 MB for
# DS 660B), large enough that no per-request overhead is modelled. Fraction of line rate achieved:
STORAGE_EFFICIENCY = 0.5

# Share of each DE node's DRAM buffer kept free of DE-side hit reads, for prefill output streaming
# in (PE-read hits + misses). Without a reserve, a buffer full of read-ahead hits could block the
# output of the very requests holding it. A quarter keeps reads flowing and output unblocked.
DE_OUTPUT_RESERVE = 0.25

# --- HBM -----------------------------------------------------------------------------------------
# Fraction of HBM usable for weights + KV (the rest: activations, CUDA graphs, allocator slack).
HBM_USABLE_FRACTION = 0.70

# --- parallelism ---------------------------------------------------------------------------------
# EP group size in nodes for the DeepSeek models (attention DP inside, lockstep MoE across the
# group). The paper's 2P4D runs one EP group per role; larger clusters are built from such units.
PREFILL_EP_NODES = 2
DECODE_EP_NODES = 4

# --- compute -------------------------------------------------------------------------------------
# Multipliers on the cost model's times (1.0 = the cost model as is). The roofline model is
# optimistic for small EP batches (kernel launch, synchronisation, imbalance across the group).
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
# quota is per layer, so the simulator passes 300 ms / num_layers.
COMPUTE_QUOTA_PER_FORWARD_S = 0.3

# --- Basic (no layerwise prefill) ----------------------------------------------------------------
# Basic keeps a whole prompt's KV (all layers) in PE HBM, loads it before computing and sends it
# after; the KV room of a PE is its HBM minus weights (HBM_USABLE_FRACTION applies).
BASIC_OVERLAP_LOAD = False

CONSTANTS = {name: value for name, value in dict(globals()).items() if name.isupper()}
