"""dualpath.runtime.server: the OpenAI-compatible HTTP API over the cluster client (docs/server.md).

Names are imported on first use, so ``ServerConfig`` (and the CLI's defaults read from it) needs no
fastapi.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "create_app": "app",
    "ServerConfig": "config",
    "BackgroundServer": "run",
    "run_server": "run",
    "serve_in_background": "run",
    "CharTokenizer": "tokenizer",
    "HFTokenizer": "tokenizer",
    "Tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
}

__all__ = [
    "BackgroundServer",
    "CharTokenizer",
    "HFTokenizer",
    "ServerConfig",
    "Tokenizer",
    "create_app",
    "load_tokenizer",
    "run_server",
    "serve_in_background",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
