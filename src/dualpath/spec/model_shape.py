"""ModelShape: one transformer's shape as the table gives it, checked, and its per-layer terms.

The fields and their checks, the layer structure (MoE, windowed and linear-attention layers), the
KV bytes and elements of one token in one layer and the FLOPs of one (query, key) pair. Conventions
(KV layouts, FLOPs per pair) are spec/model_spec.py's module doc. spec/params.py and
spec/compressed.py read a shape; :class:`~dualpath.spec.model_spec.ModelSpec` adds the totals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dualpath.core.errors import require

AttentionKind = Literal["mha", "gqa", "mla", "csa"]
ATTENTION_KINDS = ("mha", "gqa", "mla", "csa")  # csa: DeepSeek-V4 hybrid, see spec/compressed.py
POSITIVE_FIELDS = (
    "num_layers",
    "hidden_size",
    "vocab_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "total_params",
    "active_params",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """One model's shape as its table entry gives it, checked; what one layer or one (query, key)
    pair costs. The totals over layers and lengths are :class:`~dualpath.spec.model_spec.ModelSpec`'s."""

    name: str
    source: str  # where the numbers come from (config.json URL or the paper)
    num_layers: int
    hidden_size: int
    vocab_size: int
    attention_kind: AttentionKind
    num_heads: int
    num_kv_heads: int
    head_dim: int  # per-head Q/K dim (MLA: qk_nope + qk_rope)
    intermediate_size: int  # dense MLP (dense layers only in MoE models)
    kv_dtype_bytes: float
    weight_dtype_bytes: float  # mean bytes per stored parameter (MXFP4 ~ 0.53)
    total_params: int  # published, main model (no MTP head)
    active_params: int  # published, per token
    tie_word_embeddings: bool = False
    rope_theta: float | None = None
    rms_norm_eps: float | None = None  # filled where the real runtime needs it
    max_position_len: int | None = None
    # MoE
    num_routed_experts: int = 0
    num_shared_experts: int = 0
    num_active_experts: int = 0  # routed experts per token
    moe_intermediate_size: int = 0
    num_dense_layers: int = 0  # layers with a dense MLP (MoE models); all layers when not MoE
    # MLA
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    kv_bytes_per_token_layer_override: int | None = None
    # DSA sparse attention and its indexer
    sparse_top_k: int | None = None
    index_num_heads: int = 0
    index_head_dim: int = 0
    # windowed layers: layer i has full attention iff (i + 1) % full_attention_every == 0
    window_len: int | None = None
    full_attention_every: int = 1
    # linear-attention (Gated DeltaNet) layers instead of windowed ones, on the same pattern: a
    # fixed recurrent state per request (value heads x key dim x value dim, FP32) and a short
    # causal convolution, no KV that grows (Qwen3.5)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    attention_output_gate: bool = False  # full layers gate their output: Q projects 2 x heads x head_dim
    # DeepSeek-V4 ("csa"): per-layer compression ratio (0 = window only), grouped low-rank output
    compress_ratios: tuple[int, ...] = ()
    o_groups: int = 0
    o_lora_rank: int = 0
    # planner ablations (planner/ablation.py); None: from the shapes / the stage's bits
    kv_width_override: int | None = None  # KV elements per token per layer (KV bytes only)
    dtype_bytes_override: float | None = None  # element bytes of every stage's weights + activations
    dtype_override_kv: bool = False  # dtype_bytes_override also sets the KV element bytes

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_attention()
        if self.is_moe:
            self._check_moe()
        self._check_overrides()
        self._check_windows()

    # ---- checks ----------------------------------------------------------------------------
    def _check_sizes(self) -> None:
        """Positive sizes and dtypes; heads a multiple of KV heads; active within total."""
        for key in POSITIVE_FIELDS:
            require(getattr(self, key) > 0, key, getattr(self, key), "must be positive")
        require(self.kv_dtype_bytes > 0, "kv_dtype_bytes", self.kv_dtype_bytes, "must be positive")
        require(
            self.weight_dtype_bytes > 0, "weight_dtype_bytes", self.weight_dtype_bytes, "must be positive"
        )
        require(
            self.num_heads % self.num_kv_heads == 0,
            "num_kv_heads",
            self.num_kv_heads,
            f"must divide num_heads={self.num_heads}",
        )
        require(
            self.active_params <= self.total_params,
            "active_params",
            self.active_params,
            f"exceeds total_params={self.total_params}",
        )

    def _check_attention(self) -> None:
        """A known attention kind; MLA's latent, DSA's top-k and csa's per-layer ratios present."""
        require(
            self.attention_kind in ATTENTION_KINDS,
            "attention_kind",
            self.attention_kind,
            f"choices: {', '.join(ATTENTION_KINDS)}",
        )
        if self.attention_kind == "mla":
            require(
                self.kv_lora_rank > 0 and self.v_head_dim > 0,
                "kv_lora_rank",
                self.kv_lora_rank,
                "MLA needs kv_lora_rank and v_head_dim",
            )
        if self.sparse_top_k is not None:
            require(self.sparse_top_k > 0, "sparse_top_k", self.sparse_top_k, "must be positive")
        if self.attention_kind == "csa":
            self._check_csa()

    def _check_csa(self) -> None:
        require(
            len(self.compress_ratios) == self.num_layers,
            "compress_ratios",
            self.compress_ratios,
            f"needs one ratio per layer ({self.num_layers})",
        )
        require(
            self.window_len is not None
            and self.kv_bytes_per_token_layer_override is not None
            and self.o_groups > 0,
            "attention_kind",
            self.attention_kind,
            "csa needs window_len, kv_bytes_per_token_layer_override and o_groups",
        )

    def _check_moe(self) -> None:
        require(
            0 < self.num_active_experts <= self.num_routed_experts,
            "num_active_experts",
            self.num_active_experts,
            f"must be in 1..{self.num_routed_experts}",
        )
        require(
            self.moe_intermediate_size > 0,
            "moe_intermediate_size",
            self.moe_intermediate_size,
            "MoE needs an expert size",
        )
        require(
            0 <= self.num_dense_layers < self.num_layers,
            "num_dense_layers",
            self.num_dense_layers,
            f"must be below num_layers={self.num_layers}",
        )

    def _check_overrides(self) -> None:
        """The planner ablations' overrides (planner/ablation.py) in range."""
        if self.kv_width_override is not None:
            require(
                self.kv_width_override > 0,
                "kv_width",
                self.kv_width_override,
                "must be a positive number of KV elements",
            )
        if self.dtype_bytes_override is not None:
            require(
                0 < self.dtype_bytes_override <= 8,
                "dtype_bytes",
                self.dtype_bytes_override,
                "must be in (0, 8]",
            )

    def _check_windows(self) -> None:
        """Windowed or linear-attention layers need a full-attention period above 1."""
        if self.linear_num_value_heads:
            require(
                self.window_len is None and self.full_attention_every > 1,
                "linear_num_value_heads",
                self.linear_num_value_heads,
                "linear-attention layers need full_attention_every > 1 and no window",
            )
        elif self.window_len is not None and self.attention_kind != "csa":
            require(
                self.window_len > 0 and self.full_attention_every > 1,
                "window_len",
                self.window_len,
                "needs a positive window and full_attention_every > 1",
            )

    # ---- structure -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_routed_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    def layer_window(self, layer: int) -> int | None:
        """Keys a query may see in ``layer`` (None: unlimited by a window)."""
        require(0 <= layer < self.num_layers, "layer", layer, f"must be in 0..{self.num_layers - 1}")
        if self.attention_kind == "csa":
            return self.window_len if self.compress_ratios[layer] == 0 else None
        if self.is_linear_layer(layer):
            return 0  # no keys: a linear-attention layer keeps a fixed state (linear_state_bytes)
        if self.window_len is None or (layer + 1) % self.full_attention_every == 0:
            return None
        return self.window_len

    @property
    def num_window_layers(self) -> int:
        return sum(self.layer_window(i) is not None for i in range(self.num_layers))

    def is_linear_layer(self, layer: int) -> bool:
        """Layer ``layer`` is a linear-attention layer (no KV; a fixed state)."""
        return bool(self.linear_num_value_heads) and (layer + 1) % self.full_attention_every != 0

    @property
    def num_linear_layers(self) -> int:
        return sum(self.is_linear_layer(i) for i in range(self.num_layers))

    @property
    def linear_state_bytes(self) -> int:
        """One request's state in one linear-attention layer: the FP32 recurrent state
        (value heads x key dim x value dim) and the BF16 convolution window over Q, K and V."""
        if not self.linear_num_value_heads:
            return 0
        vh, kd, vd = self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim
        conv_channels = 2 * self.linear_num_key_heads * kd + vh * vd
        return vh * kd * vd * 4 + conv_channels * max(self.linear_conv_kernel - 1, 0) * 2

    # ---- one layer's KV, one pair's FLOPs ----------------------------------------------
    @property
    def kv_bytes_per_token_layer(self) -> int:
        if self.kv_bytes_per_token_layer_override is not None:
            return self.kv_bytes_per_token_layer_override
        if self.attention_kind == "mla":
            return round((self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_dtype_bytes)
        return round(2 * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes)

    @property
    def kv_elements_per_token_layer(self) -> int:
        """KV values one token keeps in one (full) layer: MLA the latent + rope
        (``kv_lora_rank + qk_rope_head_dim``), GQA/MHA ``2 x kv_heads x head_dim`` (K and V), csa one
        shared-KV entry of ``head_dim``. ``kv_width_override`` (the kv_width ablation) replaces it.
        Element counts only: the bytes follow from the precision of whoever stores them."""
        if self.kv_width_override is not None:
            return self.kv_width_override
        if self.attention_kind == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        if self.attention_kind == "csa":
            return self.head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def index_kv_bytes_per_token_layer(self) -> int:
        """DSA indexer key cache (one key of ``index_head_dim`` values + an FP32 scale); 0 without DSA.
        Not part of ``kv_bytes_per_token_layer`` (the paper's 656 B counts the MLA cache only)."""
        if not self.index_num_heads:
            return 0
        return round(self.index_head_dim * self.kv_dtype_bytes) + 4

    @property
    def attention_flops_per_pair(self) -> float:
        """FLOPs of one (query, key) pair in one layer, indexer excluded."""
        h = self.num_heads
        if self.attention_kind == "mla":  # absorbed: QK over latent + rope, PV over latent
            return 2.0 * h * (self.kv_lora_rank + self.qk_rope_head_dim) + 2.0 * h * self.kv_lora_rank
        return 4.0 * h * self.head_dim

    @property
    def indexer_flops_per_pair(self) -> float:
        return 2.0 * self.index_num_heads * self.index_head_dim

    # ---- weight term -----------------------------------------------------------------------
    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_dtype_bytes
