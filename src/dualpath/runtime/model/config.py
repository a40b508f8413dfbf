"""Decoder geometry for the Llama / Qwen2 family, and its RoPE frequencies.

``DecoderConfig`` is built from a transformers config object (``from_hf``), which has already
standardised ``rope_scaling`` / ``rope_parameters``. RoPE types supported: ``default``, ``linear`` and
``llama3`` (Llama 3.1 frequency smoothing); anything else fails with ConfigError.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from dualpath.core.errors import ConfigError, require

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True, slots=True, kw_only=True)
class DecoderConfig:
    """Shapes and constants of one decoder. ``rope_params`` holds the scaling parameters (may be empty)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str = "default"
    rope_params: tuple[tuple[str, float], ...] = field(default=())
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        require(self.model_type in SUPPORTED_MODEL_TYPES, "model_type", self.model_type,
                f"unsupported; choices: {', '.join(SUPPORTED_MODEL_TYPES)}")  # fmt: skip
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                    "num_kv_heads", "head_dim"):  # fmt: skip
            require(getattr(self, key) >= 1, key, getattr(self, key), "must be >= 1")
        require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads,
                f"must divide num_heads={self.num_heads}")  # fmt: skip
        require(self.head_dim % 2 == 0, "head_dim", self.head_dim, "must be even for RoPE")
        require(self.rope_type in SUPPORTED_ROPE_TYPES, "rope_type", self.rope_type,
                f"unsupported; choices: {', '.join(SUPPORTED_ROPE_TYPES)}")  # fmt: skip

    @property
    def kv_elems_per_token_layer(self) -> int:
        """K and V elements of one token in one layer: ``2 * num_kv_heads * head_dim``."""
        return 2 * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token_layer(self, dtype: torch.dtype) -> int:
        """Bytes of one token's K and V in one layer, at ``dtype``."""
        return self.kv_elems_per_token_layer * dtype.itemsize

    @classmethod
    def from_hf(cls, hf_config: Any) -> DecoderConfig:
        """Build from a transformers ``LlamaConfig`` / ``Qwen2Config`` (or anything with the same fields)."""
        model_type = getattr(hf_config, "model_type", None)
        require(model_type in SUPPORTED_MODEL_TYPES, "model_type", model_type,
                f"unsupported; choices: {', '.join(SUPPORTED_MODEL_TYPES)}")  # fmt: skip
        if getattr(hf_config, "use_sliding_window", False):
            raise ConfigError("use_sliding_window", True, "sliding-window attention is not supported")
        rope = dict(getattr(hf_config, "rope_parameters", None) or {})
        if not rope:  # older transformers: rope_theta + rope_scaling
            rope = dict(getattr(hf_config, "rope_scaling", None) or {})
            rope.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        rope_type = str(rope.pop("rope_type", rope.pop("type", "default")))
        theta = float(rope.pop("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
        partial = float(rope.pop("partial_rotary_factor", 1.0))
        require(partial == 1.0, "partial_rotary_factor", partial, "only 1.0 is supported")
        params = tuple(sorted((k, float(v)) for k, v in rope.items() if isinstance(v, (int, float))))
        num_heads = int(hf_config.num_attention_heads)
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        return cls(
            model_type=str(model_type),
            vocab_size=int(hf_config.vocab_size),
            hidden_size=int(hf_config.hidden_size),
            intermediate_size=int(hf_config.intermediate_size),
            num_layers=int(hf_config.num_hidden_layers),
            num_heads=num_heads,
            num_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(hf_config.rms_norm_eps),
            rope_theta=theta,
            rope_type=rope_type,
            rope_params=params,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
            max_position_embeddings=int(getattr(hf_config, "max_position_embeddings", 4096)),
        )


def rope_inv_freq(cfg: DecoderConfig) -> torch.Tensor:
    """Inverse frequencies (fp32, ``[head_dim // 2]``) with the config's RoPE scaling applied."""
    dim = cfg.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    params = dict(cfg.rope_params)
    if cfg.rope_type == "linear":
        return inv_freq / _param(params, "factor")
    if cfg.rope_type == "llama3":
        return _llama3(inv_freq, params, cfg.max_position_embeddings)
    return inv_freq


def _param(params: dict[str, float], key: str) -> float:
    if key not in params:
        raise ConfigError(f"rope_parameters.{key}", None, "missing for this rope_type")
    return params[key]


def _llama3(inv_freq: torch.Tensor, params: dict[str, float], max_pos: int) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths divided by ``factor``, a smooth ramp in between."""
    factor = _param(params, "factor")
    low = _param(params, "low_freq_factor")
    high = _param(params, "high_freq_factor")
    old_len = params.get("original_max_position_embeddings", float(max_pos))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)
