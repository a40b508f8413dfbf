"""Decode-step EP all-to-all time per MoE layer: a latency floor plus bytes over DeepEP's bandwidth.

Decode under EP + attention DP (spec section 9) runs DeepEP's low-latency kernels: every token is
sent to the GPU of each of its ``top_k`` routed experts (FP8 + per-128 scales + a 16-byte header:
``hidden + hidden / 128 * 4 + 16`` bytes per selection) and each expert's output comes back in
BF16 (``2 * hidden`` bytes), with no node deduplication. DeepEP's maintainers describe the time
as data amount / bandwidth (deepseek-ai/DeepEP issue 220), and its README (docs/legacy.md,
"Low-latency kernels with pure RDMA": H800, CX7 400 Gb/s, 128 tokens per GPU, hidden 7168, top-8)
publishes the bandwidths by EP size, below (dispatch, combine) in GB/s; 128 tokens at EP 32 take
155 + 273 us. Those are the constants used here, not fitted; the bandwidth scales with the node's
CNIC rate over the 400 Gb/s they were measured on, and an EP size between table rows takes the
next smaller row's bandwidth (the smaller EP sizes are faster, so this is the conservative row).

What the bytes do not give, a per-layer floor (kernel launches, the signalling round trips and the
wait for the slowest rank), is ``Calibration.ep_layer_latency_rdma_s`` (the one refitted constant).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from dualpath.spec.models import ModelSpec

# DeepEP docs/legacy.md, low-latency kernels, H800 + CX7 400 Gb/s: EP size -> (dispatch, combine)
# "RDMA bandwidth" in GB/s at 128 tokens per GPU (logical: bytes of every selection / time).
DEEPEP_LL_GBS: Final[dict[int, tuple[float, float]]] = {
    8: (98.0, 127.0),
    16: (63.0, 74.0),
    32: (48.0, 53.0),
    64: (43.0, 46.0),
    128: (39.0, 39.0),
    256: (39.0, 40.0),
}
DEEPEP_MEASURED_CNIC_GBPS: Final = 400.0  # the CX7 the table was measured on
DEEPEP_HEADER_BYTES: Final = 16  # per dispatched selection (tests/legacy/test_low_latency.py)


def ll_selection_bytes(model: ModelSpec) -> tuple[float, float]:
    """(dispatch, combine) bytes of one token-expert selection in DeepEP's low-latency kernels."""
    hidden = model.hidden_size
    return hidden + hidden / 128 * 4 + DEEPEP_HEADER_BYTES, 2.0 * hidden


def ll_bandwidth_bytes_per_s(
    ep_size: int, cnic_gbps: float = DEEPEP_MEASURED_CNIC_GBPS
) -> tuple[float, float]:
    """DeepEP's published (dispatch, combine) bandwidth at ``ep_size`` (bytes/s), scaled to the CNIC."""
    rows = sorted(DEEPEP_LL_GBS)
    row = max((e for e in rows if e <= ep_size), default=rows[0])
    dispatch, combine = DEEPEP_LL_GBS[row]
    scale = cnic_gbps / DEEPEP_MEASURED_CNIC_GBPS * 1e9
    return dispatch * scale, combine * scale


def decode_a2a_bytes_s_per_token(model: ModelSpec, ep_size: int, cnic_gbps: float) -> float:
    """Seconds of bytes-over-bandwidth one token on a GPU adds to one MoE layer's dispatch +
    combine (the floor excluded): ``top_k`` selections at DeepEP's low-latency bandwidths."""
    if not model.is_moe or ep_size <= 1:
        return 0.0
    d_bytes, c_bytes = ll_selection_bytes(model)
    d_bw, c_bw = ll_bandwidth_bytes_per_s(ep_size, cnic_gbps)
    return model.num_active_experts * (d_bytes / d_bw + c_bytes / c_bw)


def decode_cnic_bytes_per_token(model: ModelSpec, ep_size: int, num_gpus_per_node: int) -> float:
    """CNIC bytes one decode token sends (and, balanced, receives) in one step over all MoE
    layers: the low-latency kernels send each selection to its expert's GPU, and the selections
    whose GPU is on another node cross the CNIC (the rest go over NVLink)."""
    if not model.is_moe or ep_size <= num_gpus_per_node:
        return 0.0
    nodes = -(-ep_size // num_gpus_per_node)
    d_bytes, c_bytes = ll_selection_bytes(model)
    remote = model.num_active_experts * (nodes - 1) / nodes
    return model.num_moe_layers * remote * (d_bytes + c_bytes)
