"""A Llama / Qwen2 decoder with a layer-at-a-time API over packed (varlen) batches.

A batch is a list of spans, one per request: ``Span(cached_len, new_len)``. The new tokens of all spans
are packed along one token axis ``T = sum(new_len)``. ``run_layer`` takes, per span, that layer's cached
KV as one tensor ``[cached_len, 2, num_kv_heads, head_dim]`` (K then V per token: the Layer Block byte
layout of the KV store) and returns the new tokens' KV in the same layout, packed ``[T, 2, kv, d]``.
The numerics follow transformers' Llama/Qwen2 (RMSNorm in fp32, RoPE cos/sin in fp32, SDPA) so fp32
results agree with a full transformers forward to ~1e-5.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dualpath.core.errors import ConfigError
from dualpath.runtime.model.config import DecoderConfig, rope_inv_freq


@dataclass(frozen=True, slots=True)
class Span:
    """One request's slice of a batch: ``cached_len`` tokens already have KV, ``new_len`` are computed."""

    cached_len: int
    new_len: int


@dataclass(frozen=True, slots=True)
class _LayerWeights:
    """One layer's tensors as ``run_layer`` uses them: projections fused and transposed ``[in, out]``."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv_t: torch.Tensor  # [hidden, (heads + 2 kv_heads) * head_dim]: q | k | v
    qkv_bias: torch.Tensor | None
    o_t: torch.Tensor
    gate_t: torch.Tensor  # gate and up stay two GEMMs: silu and the product on one fused output's
    up_t: torch.Tensor  # strided halves cost more than the second GEMM saves from 64 rows up
    down_t: torch.Tensor


_LAYER_KEYS = (
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)  # fmt: skip
MASK_CACHE_ENTRIES = 16  # cached-prefix masks kept across layers (spans of the current batch)
_BIAS_KEYS = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` (transformers' RoPE, ``x`` ``[T, heads, d]``, ``cos``/``sin``
    ``[T, d]``) without building ``rotate_half(x)``: the two halves are accumulated in place (2.4x
    faster at 512 tokens, equal to ~1 ulp)."""
    half = x.shape[-1] // 2
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-1.0)
    out[..., half:].addcmul_(x[..., :half], sin[..., half:])
    return out


class Decoder:
    """Weights plus the four steps of a forward: ``embed``, ``run_layer`` (per layer), ``final``.

    Holds no KV: callers own every cache and pass one layer's cached KV per call. Not thread-safe for
    concurrent calls on the same layer; stateless otherwise.
    """

    def __init__(
        self,
        config: DecoderConfig,
        weights: Mapping[str, torch.Tensor],
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        w = {k: self._take(weights, k) for k in self._needed_keys()}
        embed = w["model.embed_tokens.weight"]
        # lm_head as [hidden, vocab] (a copy when tied: the embedding lookup needs [vocab, hidden])
        head_t = w.get("lm_head.weight", embed).t().contiguous()
        self._adopt(
            [self._pack_layer(w, i) for i in range(config.num_layers)], embed, w["model.norm.weight"], head_t
        )

    def _adopt(
        self, layers: list[_LayerWeights], embed: torch.Tensor, norm: torch.Tensor, head_t: torch.Tensor
    ) -> None:
        """Take packed weights as they are (``__init__``'s, or a shared file's: ``model/packed.py``)."""
        self._layers, self._embed, self._norm, self._head_t = layers, embed, norm, head_t
        self._inv_freq = rope_inv_freq(self.config).to(self.device)
        self._scale = self.config.head_dim**-0.5
        self._masks: dict[tuple[int, int, torch.dtype, torch.device], torch.Tensor] = {}

    def _needed_keys(self) -> list[str]:
        keys = ["model.embed_tokens.weight", "model.norm.weight"]
        if not self.config.tie_word_embeddings:
            keys.append("lm_head.weight")
        per_layer = _LAYER_KEYS + (_BIAS_KEYS if self.config.qkv_bias else ())
        for i in range(self.config.num_layers):
            keys.extend(f"model.layers.{i}.{k}" for k in per_layer)
        return keys

    def _take(self, weights: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
        if key not in weights:
            raise ConfigError("weights", key, "missing tensor in checkpoint")
        return weights[key].to(device=self.device, dtype=self.dtype).contiguous()

    def _pack_layer(self, w: Mapping[str, torch.Tensor], layer: int) -> _LayerWeights:
        """One layer's projections fused and stored transposed (``[in, out]``, as vLLM's
        QKV linear fuses them): ``x @ W`` on a contiguous ``[in, out]`` weight runs 1.1-1.8x
        faster on CPU than ``F.linear``'s transposed read at 8-64 rows (the same bits from 64 rows up;
        benchmarks/engine_speed.py), and one GEMM replaces three (q, k, v). (Keeping the MLP's
        ``[out, in]`` for ``F.linear`` looks 1.1x faster in a loop over cold layer weights but made
        a whole 512-token forward 8% slower: measured in the forward, not per GEMM.)"""
        p = f"model.layers.{layer}."

        def cat_t(*names: str) -> torch.Tensor:
            return torch.cat([w[p + n + ".weight"] for n in names], dim=0).t().contiguous()

        qkv_bias = None
        if self.config.qkv_bias:
            qkv_bias = torch.cat([w[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]).contiguous()
        return _LayerWeights(
            input_norm=w[p + "input_layernorm.weight"],
            post_norm=w[p + "post_attention_layernorm.weight"],
            qkv_t=cat_t("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            qkv_bias=qkv_bias,
            o_t=cat_t("self_attn.o_proj"),
            gate_t=cat_t("mlp.gate_proj"),
            up_t=cat_t("mlp.up_proj"),
            down_t=cat_t("mlp.down_proj"),
        )

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    def embed(self, token_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Embeddings of packed token ids ``[T]`` -> hidden states ``[T, hidden]``."""
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device)
        return F.embedding(ids, self._embed)

    def final(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm and lm_head: ``[N, hidden]`` -> logits ``[N, vocab]`` (model dtype)."""
        h = _rms_norm(hidden, self._norm, self.config.rms_norm_eps)
        return torch.mm(h, self._head_t)

    def positions(self, spans: Sequence[Span]) -> torch.Tensor:
        """Packed absolute positions of the new tokens of ``spans``."""
        parts = [torch.arange(s.cached_len, s.cached_len + s.new_len) for s in spans]
        return torch.cat(parts).to(self.device) if parts else torch.empty(0, dtype=torch.long)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[T, head_dim]`` for absolute ``positions`` (computed in fp32, cast to model dtype)."""
        freqs = positions.to(torch.float32)[:, None] * self._inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def run_layer(
        self,
        layer: int,
        hidden: torch.Tensor,
        spans: Sequence[Span],
        cached_kv: Sequence[torch.Tensor | None],
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        *,
        cache_has_room: bool = False,
        keep_last: Sequence[bool] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder layer over packed new tokens.

        ``cached_kv[j]`` is ``[spans[j].cached_len, 2, kv_heads, head_dim]`` (None when cached_len is 0).
        With ``cache_has_room`` each non-None ``cached_kv[j]`` has at least ``cached_len + new_len``
        rows and the new tokens' KV is written into rows ``[cached_len, cached_len + new_len)`` (the only
        mutation), which saves concatenating cached and new KV; otherwise inputs are not mutated.
        ``rope`` may pass precomputed ``self.rope(self.positions(spans))`` to share it across layers.
        Returns ``(hidden_out [T, hidden], new_kv [T, 2, kv_heads, head_dim])``.

        ``keep_last`` (a model's last layer, where only sampled positions matter): every token's KV
        is still computed and returned, but the attention output, o_proj and MLP run only for the
        last token of each span whose flag is True; ``hidden_out`` then has one row per such span
        (none for a chunk that samples nothing).
        """
        cfg, lw = self.config, self._layers[layer]
        nq, nkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        cos, sin = rope if rope is not None else self.rope(self.positions(spans))
        x = _rms_norm(hidden, lw.input_norm, cfg.rms_norm_eps)
        qkv = torch.mm(x, lw.qkv_t) if lw.qkv_bias is None else torch.addmm(lw.qkv_bias, x, lw.qkv_t)
        # RoPE on q and k at once: their heads are adjacent in the fused output
        qk = qkv[:, : nq + nkv].view(-1, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim)
        qk = _apply_rope(qk, cos, sin)
        q = qk[:, : cfg.num_heads]
        k = qk[:, cfg.num_heads :]
        v = qkv[:, nq + nkv :].view(-1, cfg.num_kv_heads, cfg.head_dim)
        new_kv = torch.stack((k, v), dim=1)
        attn = self._attention(q, new_kv, spans, cached_kv, cache_has_room, keep_last)
        if keep_last is not None:
            ends = torch.tensor([s.new_len for s in spans]).cumsum(0) - 1
            hidden = hidden[ends[torch.tensor(list(keep_last), dtype=torch.bool)].to(hidden.device)]
            if not hidden.shape[0]:
                return hidden, new_kv
        # in place on fresh temporaries (same values as the out-of-place ops, fewer allocations)
        h = torch.mm(attn, lw.o_t).add_(hidden)
        x = _rms_norm(h, lw.post_norm, cfg.rms_norm_eps)
        act = F.silu(torch.mm(x, lw.gate_t), inplace=True).mul_(torch.mm(x, lw.up_t))
        h = torch.mm(act, lw.down_t).add_(h)
        return h, new_kv

    def _attention(
        self,
        q: torch.Tensor,
        new_kv: torch.Tensor,
        spans: Sequence[Span],
        cached_kv: Sequence[torch.Tensor | None],
        cache_has_room: bool = False,
        keep_last: Sequence[bool] | None = None,
    ) -> torch.Tensor:
        """Causal attention per span over (cached + new) keys; returns ``[T, heads * head_dim]``
        (with ``keep_last``: only each flagged span's last query, one row per flagged span).

        Every call is 4-D (``[1, heads, seq, d]``) with K/V as strided views of the ``[L, 2, kv, d]``
        layout (no copies), so SDPA picks its fused (flash) kernel: a plain prefill uses
        ``is_causal``; one new token (decode) stacks the ``group`` query heads of each KV head along
        the query axis and needs no mask; only new tokens on a cached prefix take an additive mask."""
        outs, start = [], 0
        kv_heads, group = self.config.num_kv_heads, self.config.num_heads // self.config.num_kv_heads
        keep = [None] * len(spans) if keep_last is None else list(keep_last)
        for span, cached, last in zip(spans, cached_kv, keep, strict=True):
            end = start + span.new_len
            kv = new_kv[start:end]
            if span.cached_len:
                total = span.cached_len + span.new_len
                rows = None if cached is None else cached.shape[0]
                if rows is None or rows < span.cached_len or (cache_has_room and rows < total):
                    raise ConfigError("cached_kv", rows, f"expected {span.cached_len} cached tokens"
                                      + (f" and room for {span.new_len} more" if cache_has_room else ""))  # fmt: skip
                assert cached is not None
                if cache_has_room:
                    cached[span.cached_len : total].copy_(kv)
                    kv = cached[:total]
                else:
                    kv = torch.cat((cached[: span.cached_len].to(kv.dtype), kv), dim=0)
            n = span.new_len
            if last is False:  # this span's KV is written; no query of it is needed
                start = end
                continue
            kh, vh = kv[:, 0].transpose(0, 1)[None], kv[:, 1].transpose(0, 1)[None]  # [1, kv_heads, L, d]
            if n == 1 or last:  # one query that sees every key (decode, or a span's last token):
                # row r of KV head j is query head j * group + r: no mask, no GQA expansion
                qg = q[end - 1].view(1, kv_heads, group, -1)
                o = F.scaled_dot_product_attention(qg, kh, vh, scale=self._scale)
                outs.append(o.reshape(1, -1))
            else:
                q4 = q[start:end].transpose(0, 1)[None]  # [1, heads, n, d]
                mask = self._prefix_mask(span.cached_len, n, q.dtype, q.device) if span.cached_len else None
                o = F.scaled_dot_product_attention(q4, kh, vh, attn_mask=mask, is_causal=mask is None,
                                                   scale=self._scale, enable_gqa=group > 1)  # fmt: skip
                outs.append(o[0].transpose(0, 1).reshape(n, -1))
            start = end
        if not outs:
            return q.new_empty((0, q.shape[1] * q.shape[2]))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _prefix_mask(self, cached_len: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``[n, cached_len + n]`` additive mask (0 or -inf) of ``n`` new tokens after ``cached_len``
        cached ones; the same for every layer, so the last few are kept."""
        key = (cached_len, n, dtype, device)
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) >= MASK_CACHE_ENTRIES:
                self._masks.clear()
            key_pos = torch.arange(cached_len + n, device=device)
            query_pos = torch.arange(n, device=device) + cached_len
            allowed = key_pos[None, :] <= query_pos[:, None]
            mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(
                ~allowed, float("-inf")
            )
            self._masks[key] = mask
        return mask

    def forward_full(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Whole-prompt forward with no cache (a reference path): logits ``[len, vocab]``."""
        spans = [Span(0, len(token_ids))]
        h = self.embed(token_ids)
        rope = self.rope(self.positions(spans))
        for i in range(self.num_layers):
            h, _ = self.run_layer(i, h, spans, [None], rope)
        return self.final(h)
