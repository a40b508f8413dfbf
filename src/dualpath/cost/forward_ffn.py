"""The feed-forward side of one forward iteration: dense MLP, router, routed and shared experts,
the TP all-reduce and attention-DP collectives, and the small elementwise kernels.

:class:`FeedForward` holds what a deployment is (kernels, model, parallel sizes, precision, backend);
cost/forward.py's ``Forward`` adds the attention ops and the step. Conventions: forward.py's doc.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.cost.kernel_base import OpTime
from dualpath.cost.kernels import KernelTables
from dualpath.cost.latency_terms import (
    ELEMENTWISE_KERNELS,
    FUSED_NORMS_TRTLLM,
    MOE_DISTRIBUTION,
    Parallel,
    Precision,
)
from dualpath.cost.step import StepTime
from dualpath.spec.model_spec import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedForward:
    """``model`` on ``kernels``' system with ``par`` and ``prec``, run by ``backend``: its
    feed-forward and collective ops (cost/forward.py's ``Forward`` adds attention)."""

    kernels: KernelTables
    model: ModelSpec
    par: Parallel
    prec: Precision
    backend: str = "trtllm"

    # ---- MLP / MoE --------------------------------------------------------------------------
    def _mlp(self, out: StepTime, tokens: float, layers: int) -> None:
        if layers <= 0:
            return
        m, k, tp = self.model, self.kernels, self.par.tp
        inter = -(-m.intermediate_size // tp)
        out.add("mlp_gemm", k.gemm(tokens, 2 * inter, m.hidden_size, self.prec.gemm), layers)
        out.add("mlp_gemm", k.gemm(tokens, m.hidden_size, inter, self.prec.gemm), layers)
        self._allreduce(out, tokens, layers)

    def _moe(self, out: StepTime, tokens: float, layers: int, *, decode_only: bool = False) -> None:
        """Router, routed and shared experts, and the collectives around them. In TensorRT-LLM's
        decode CUDA graphs the shared experts run on an auxiliary stream beside the routed ones
        (its DeepSeek-V3 model code, ``maybe_execute_in_parallel``): they cost only what exceeds
        the routed experts' time."""
        m, k, par = self.model, self.kernels, self.par
        out.add("moe_router_gemm", k.gemm(tokens, m.num_routed_experts, m.hidden_size, "bfloat16"), layers)
        group = tokens * par.attention_dp
        routed = k.moe(
            tokens=group,
            hidden=m.hidden_size,
            inter=m.moe_intermediate_size,
            topk=m.num_active_experts,
            experts=m.num_routed_experts,
            moe_tp=par.moe_tp,
            moe_ep=par.moe_ep,
            dtype=self.prec.moe,
            distribution=MOE_DISTRIBUTION,
        )
        out.add("moe_experts", routed, layers)
        if m.num_shared_experts:
            inter = -(-m.num_shared_experts * m.moe_intermediate_size // par.tp)
            up = k.gemm(tokens, 2 * inter, m.hidden_size, self.prec.gemm)
            down = k.gemm(tokens, m.hidden_size, inter, self.prec.gemm)
            if decode_only and self.backend == "trtllm":
                hidden = max(up.time_s + down.time_s - routed.time_s, 0.0)
                out.add(
                    "moe_shared_gemm",
                    OpTime(hidden, f"{up.source}, overlapped with the routed experts"),
                    layers,
                )
            else:
                out.add("moe_shared_gemm", up, layers)
                out.add("moe_shared_gemm", down, layers)
        gpus = par.tp * par.attention_dp
        if par.attention_dp > 1:  # gather every rank's tokens for the experts, scatter the sums
            for op in ("all_gather", "reduce_scatter"):
                out.add(
                    "moe_comm",
                    k.collective(op, elements=group * m.hidden_size, num_gpus=gpus, backend=self.backend),
                    layers,
                )
        else:
            self._allreduce(out, tokens, layers)

    def _allreduce(self, out: StepTime, tokens: float, layers: int) -> None:
        if self.par.tp > 1:
            out.add(
                "tp_allreduce",
                self.kernels.collective(
                    "all_reduce",
                    elements=tokens * self.model.hidden_size,
                    num_gpus=self.par.tp,
                    backend=self.backend,
                ),
                layers,
            )

    def _elementwise(self, out: StepTime, tokens: float, layers: int) -> None:
        """Norms, rope/KV append, activation, residual: bandwidth-bound, each at least the
        fastest measured kernel (``KernelTables.launch_floor_s``)."""
        k = self.kernels
        count = ELEMENTWISE_KERNELS
        if self.backend == "trtllm" and self.par.tp > 1:
            count -= FUSED_NORMS_TRTLLM  # both RMSNorms ride in TensorRT-LLM's fused all-reduce
        num_bytes = tokens * self.model.hidden_size * 2 * 2  # read + write BF16 activations
        eff = k.efficiency.gemm_memory
        each = max(k.launch_floor_s, num_bytes / (k.system.gpu.mem_bytes_per_s * eff))
        out.add(
            "elementwise",
            OpTime(each, "roofline: elementwise kernels (no table), floored at the fastest measured kernel"),
            count * layers,
        )
