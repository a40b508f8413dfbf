"""The proxy's tokenizer: the model folder's ``tokenizer.json`` (the ``tokenizers`` library; no
vLLM). The proxy sends vLLM token ids, so both instances of a request see the very same prompt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dualpath.core.errors import ConfigError


def load_tokenizer(model_dir: str | Path) -> Callable[[str], list[int]]:
    """``text -> token ids`` of ``model_dir``'s tokenizer (no special tokens added)."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise ConfigError("model", str(model_dir), "has no tokenizer.json")
    tok = Tokenizer.from_file(str(path))

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False).ids)

    return encode
