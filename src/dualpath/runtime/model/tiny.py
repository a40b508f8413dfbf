"""Tiny random checkpoints for tests: a real transformers model, saved as a Hugging Face folder.

``make_tiny_checkpoint`` builds a ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` from a small config
with a fixed seed and saves it (config.json + model.safetensors), so our loader reads it back and
transformers itself is the oracle. The init scale is raised (0.2 instead of 0.02) so logits are peaked
and greedy choices are not decided by rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dualpath.core.errors import require

FAMILIES = ("llama", "qwen2")


@dataclass(frozen=True, slots=True, kw_only=True)
class TinySpec:
    """Shape of a tiny test model. ``rope_scaling`` e.g. ``{"rope_type": "llama3", ...}`` or None."""

    family: str = "llama"
    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    init_std: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.family in FAMILIES, "family", self.family, f"choices: {', '.join(FAMILIES)}")


LLAMA3_SCALING = (
    ("rope_type", "llama3"), ("factor", 8.0), ("low_freq_factor", 1.0),
    ("high_freq_factor", 4.0), ("original_max_position_embeddings", 64),
)  # fmt: skip


def tiny_hf_config(spec: TinySpec) -> Any:
    """The transformers config of ``spec``."""
    from transformers import LlamaConfig, Qwen2Config

    kwargs: dict[str, Any] = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=4096, rms_norm_eps=1e-6, initializer_range=spec.init_std,
        tie_word_embeddings=spec.tie_word_embeddings, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if spec.rope_scaling:
        rope = dict(spec.rope_scaling) | {"rope_theta": spec.rope_theta}
    kwargs["rope_parameters"] = rope
    cls = LlamaConfig if spec.family == "llama" else Qwen2Config
    return cls(**kwargs)


def make_tiny_hf_model(spec: TinySpec) -> Any:
    """A seeded random transformers CausalLM (fp32, eval mode) for ``spec``."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    cls = LlamaForCausalLM if spec.family == "llama" else Qwen2ForCausalLM
    model = cls(tiny_hf_config(spec)).to(torch.float32).eval()  # type: ignore[arg-type]
    with torch.no_grad():  # norms init to 1 and biases to 0; perturb so they are really tested
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def make_tiny_checkpoint(folder: str | Path, spec: TinySpec | None = None) -> Path:
    """Save a tiny random model to ``folder`` (created) and return the folder."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    make_tiny_hf_model(spec or TinySpec()).save_pretrained(str(path), safe_serialization=True)
    return path


def random_weights(config: Any, seed: int = 0, std: float = 0.05) -> dict[str, torch.Tensor]:
    """Seeded random fp32 tensors, transformers-named, for a ``DecoderConfig`` (no transformers needed;
    for benchmarks at realistic shapes)."""
    g = torch.Generator().manual_seed(seed)
    h, kv = config.hidden_size, config.num_kv_heads * config.head_dim
    q, inter = config.num_heads * config.head_dim, config.intermediate_size

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    w = {"model.embed_tokens.weight": rnd(config.vocab_size, h), "model.norm.weight": torch.ones(h),
         "lm_head.weight": rnd(config.vocab_size, h)}  # fmt: skip
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
              p + "self_attn.q_proj.weight": rnd(q, h), p + "self_attn.k_proj.weight": rnd(kv, h),
              p + "self_attn.v_proj.weight": rnd(kv, h), p + "self_attn.o_proj.weight": rnd(h, q),
              p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
              p + "mlp.down_proj.weight": rnd(h, inter)}  # fmt: skip
        if config.qkv_bias:
            w |= {p + "self_attn.q_proj.bias": rnd(q), p + "self_attn.k_proj.bias": rnd(kv),
                  p + "self_attn.v_proj.bias": rnd(kv)}  # fmt: skip
    return w
