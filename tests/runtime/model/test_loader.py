from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dualpath.core.errors import ConfigError
from dualpath.runtime.model import load_checkpoint, resolve_model


def test_missing_path_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope"):
        load_checkpoint(str(tmp_path / "nope"))


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config.json"):
        load_checkpoint(str(tmp_path))


def test_missing_safetensors_and_truncated(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "m"
    shutil.copytree(tiny_dirs["llama"], bad)
    st = bad / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="unreadable safetensors") as err:
        load_checkpoint(str(bad))
    assert str(st) in str(err.value)
    st.unlink()
    with pytest.raises(ConfigError, match="missing safetensors"):
        load_checkpoint(str(bad))


def test_unsupported_model_type(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "m"
    shutil.copytree(tiny_dirs["llama"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="model_type"):
        load_checkpoint(str(bad))


def test_packaged_default_model_resolves() -> None:
    folder, gguf = resolve_model("smollm2-135m")
    assert gguf is not None and (folder / gguf).is_file()
    with pytest.raises(ConfigError, match="not a known model name"):
        resolve_model("no-such-model")


def test_folder_without_tokenizer_fails_fast(tiny_dirs: dict[str, Path]) -> None:
    from dualpath.runtime.model import load_tokenizer

    with pytest.raises(ConfigError, match="no tokenizer files"):
        load_tokenizer(str(tiny_dirs["llama"]))
