"""One forward iteration of a deployed model on one GPU, op by op, from cost/kernels.py.

A deployment runs ``tp x attention_dp x pp`` GPUs per replica. Attention is split ``tp`` ways
(heads; KV heads are replicated when fewer than ``tp``) and each of the ``attention_dp`` ranks runs
its own requests; routed experts are split ``moe_tp x moe_ep`` over the ``tp x attention_dp`` GPUs.
A :class:`Step` is what one attention rank computes in one iteration: ``ctx_requests`` prompts of
``isl`` new tokens (after ``prefix`` cached ones) and ``gen_requests`` decode tokens over a mean
KV length ``kv_len``; every GEMM sees all ``ctx_requests x isl + gen_requests`` tokens (mixed
batch). Counts may be fractional (steady-state averages): a kernel below one request is charged
the one-request time scaled by the fraction.

Per layer: QKV and output projections, attention (context and generation kernels, or the MLA
module table for the DeepSeek-V3 shape), dense MLP or router + routed experts + shared experts,
TP all-reduce (after attention and after the MLP), the attention-DP all-gather / reduce-scatter
around the experts, and the small elementwise kernels (norms, rope, activation, quantisation).
Per iteration: the LM head for the requests that emit a token and the host overhead of the
backend (cost/latency_terms.py).
"""

from __future__ import annotations

from dualpath.cost.forward_ffn import FeedForward
from dualpath.cost.kernels import OpTime
from dualpath.cost.latency_terms import (
    iteration_overhead_s,
    padded_decode_batch,
)
from dualpath.cost.step import Step, StepTime, fractional

__all__ = ["GDN_CHUNK", "V3_MLA_SHAPE", "Forward", "Step", "StepTime"]

V3_MLA_SHAPE = (7168, 128, 1536)  # hidden, heads, q_lora of the DeepSeek-V3 MLA module tables
GDN_CHUNK = 64  # the chunk length of the chunked delta-rule kernels (flash-linear-attention)


class Forward(FeedForward):
    """``model`` on ``kernels``' system with ``par`` and ``prec``, run by ``backend``: the step op by
    op; attention here, the MLP / MoE, collectives and elementwise kernels in cost/forward_ffn.py."""

    __slots__ = ()

    def step(self, step: Step) -> StepTime:
        out = StepTime()
        m = self.model
        tokens = step.num_tokens
        if tokens <= 0:
            return out
        if not step.ctx_requests:  # a decode-only iteration runs at its CUDA graph's batch
            tokens = padded_decode_batch(self.backend, step.gen_requests)
        for window, count in self._attention_layers():
            self._attention(out, step, tokens, window, count)
        if m.num_linear_layers:
            self._linear_attention(out, step, tokens, m.num_linear_layers)
        num_moe = m.num_moe_layers
        self._mlp(out, tokens, m.num_layers - num_moe)
        if num_moe:
            self._moe(out, tokens, num_moe, decode_only=not step.ctx_requests)
        self._elementwise(out, tokens, m.num_layers)
        emitting = step.ctx_requests + step.gen_requests
        out.add(
            "lm_head", self.kernels.gemm(emitting, -(-m.vocab_size // self.par.tp), m.hidden_size, "bfloat16")
        )
        out.add(
            "iteration_overhead",
            OpTime(iteration_overhead_s(self.backend), f"constant ({self.backend}, cost/latency_terms.py)"),
        )
        return out

    # ---- attention -------------------------------------------------------------------------
    def _attention_layers(self) -> list[tuple[int, int]]:
        m = self.model
        if m.window_len is None:
            return [(0, m.num_layers - m.num_linear_layers)]
        windowed = m.num_window_layers
        return [(m.window_len, windowed), (0, m.num_layers - windowed)]

    def _attention(self, out: StepTime, step: Step, tokens: float, window: int, layers: int) -> None:
        """``tokens``: the rows the GEMMs and collectives compute (the step's, or its padded
        CUDA-graph batch); attention itself sees only the real requests."""
        m, tp, k = self.model, self.par.tp, self.kernels
        if m.attention_kind == "mla":
            self._mla(out, step, tokens, layers)
            return
        heads = m.num_heads // tp
        kv_heads = max(1, m.num_kv_heads // tp)
        q_heads = heads * (2 if m.attention_output_gate else 1)  # the gate rides on the Q projection
        qkv_n = (q_heads + 2 * kv_heads) * m.head_dim
        out.add("attn_qkv_gemm", k.gemm(tokens, qkv_n, m.hidden_size, self.prec.gemm), layers)
        out.add("attn_out_gemm", k.gemm(tokens, m.hidden_size, heads * m.head_dim, self.prec.gemm), layers)
        kv = self.prec.kv
        if step.ctx_requests:
            out.add(
                "attn_context",
                fractional(
                    step.ctx_requests,
                    lambda b: k.context_attention(
                        batch=b,
                        isl=step.isl,
                        prefix=step.prefix,
                        heads=heads,
                        kv_heads=kv_heads,
                        head_dim=m.head_dim,
                        kv_dtype=kv,
                        window=window,
                    ),
                ),
                layers,
            )
        if step.gen_requests:
            out.add(
                "attn_generation",
                fractional(
                    step.gen_requests,
                    lambda b: k.generation_attention(
                        batch=b,
                        kv_len=step.kv_len,
                        heads=heads,
                        kv_heads=kv_heads,
                        head_dim=m.head_dim,
                        kv_dtype=kv,
                        window=window,
                    ),
                ),
                layers,
            )
        self._allreduce(out, tokens, layers)

    def _mla(self, out: StepTime, step: Step, tokens: float, layers: int) -> None:
        m, k, prec = self.model, self.kernels, self.prec
        heads = m.num_heads // self.par.tp
        for phase, count, length in (
            ("context", step.ctx_requests, step.isl + step.prefix),
            ("generation", step.gen_requests, step.kv_len),
        ):
            if not count:
                continue
            if m.sparse_top_k is not None and phase == "generation":
                length = min(length, m.sparse_top_k)
            module = None
            if (m.hidden_size, m.num_heads, m.q_lora_rank) == V3_MLA_SHAPE:  # the module tables' shape
                module = k.mla_module(
                    phase,
                    batch=max(count, 1.0),
                    length=length,
                    heads=heads,
                    gemm_dtype=prec.gemm,
                    kv_dtype=prec.kv,
                )
            if module is not None:
                out.add(f"mla_{phase}_module", module * (count / max(count, 1.0)), layers)
                continue
            self._mla_parts(out, phase, count, length, heads, layers)
        self._allreduce(out, tokens, layers)

    def _mla_parts(
        self, out: StepTime, phase: str, count: float, length: float, heads: int, layers: int
    ) -> None:
        m, k, g = self.model, self.kernels, self.prec.gemm
        tokens = count * (length if phase == "context" else 1)
        rope, nope, v = m.qk_rope_head_dim, m.head_dim - m.qk_rope_head_dim, m.v_head_dim
        q_in = m.q_lora_rank or m.hidden_size
        gemms = [
            (m.kv_lora_rank + rope + (m.q_lora_rank or 0), m.hidden_size),
            (heads * m.head_dim, q_in),
            (heads * (nope + v), m.kv_lora_rank),
            (m.hidden_size, heads * v),
        ]
        for n, kk in gemms:
            out.add("attn_proj_gemm", k.gemm(tokens, n, kk, g), layers)
        pairs = count * (length * (length + 1) / 2 if phase == "context" else length)
        flops = pairs * m.attention_flops_per_pair / self.par.tp
        kv_bytes = count * length * m.kv_bytes_per_token_layer
        out.add(
            f"mla_{phase}",
            fractional(
                count,
                lambda b: k.mla_kernel(
                    phase,
                    batch=b,
                    length=length,
                    heads=heads,
                    kv_dtype=self.prec.kv,
                    flops=flops * b / count,
                    num_bytes=kv_bytes * b / count,
                ),
            ),
            layers,
        )

    def _linear_attention(self, out: StepTime, step: Step, tokens: float, layers: int) -> None:
        """Gated DeltaNet layers (Qwen3.5): the input projections (Q, K, V, output gate, beta /
        alpha) and the output projection from the GEMM tables; the recurrence by roofline (no
        table measures it): per new token and value head a state update and a readout of
        ``key dim x value dim`` multiply-adds each, plus, for chunked prefill (chunks of
        ``GDN_CHUNK``), the intra-chunk products over the key and value dims; every request reads
        and writes its FP32 state once per iteration; then the TP all-reduce."""
        m, k, tp = self.model, self.kernels, self.par.tp
        kd, vd = m.linear_key_head_dim, m.linear_value_head_dim
        qk, v = m.linear_num_key_heads * kd, m.linear_num_value_heads * vd
        n_in = -(-(2 * qk + 2 * v + 2 * m.linear_num_value_heads) // tp)
        out.add("linear_attn_proj_gemm", k.gemm(tokens, n_in, m.hidden_size, self.prec.gemm), layers)
        out.add("linear_attn_proj_gemm", k.gemm(tokens, m.hidden_size, -(-v // tp), self.prec.gemm), layers)
        heads = max(1, m.linear_num_value_heads // tp)
        new_tokens = step.ctx_requests * step.isl + step.gen_requests
        per_token = 4.0 * kd * vd + (2.0 * GDN_CHUNK * (kd + vd) if step.ctx_requests else 0.0)
        flops = new_tokens * heads * per_token
        requests = step.ctx_requests + step.gen_requests
        num_bytes = requests * 2 * heads * kd * vd * 4 + new_tokens * heads * (2 * kd + 2 * vd) * 2
        eff = k.efficiency
        time_s = k.roofline(flops, num_bytes, 16, eff.attention_compute, eff.attention_memory)
        out.add(
            "linear_attention",
            OpTime(max(time_s, k.launch_floor_s), "roofline: Gated DeltaNet recurrence (no table)"),
            layers,
        )
        self._allreduce(out, tokens, layers)
