"""dualpath.runtime.server: the OpenAI-compatible HTTP API over the cluster client (docs/server.md)."""

from __future__ import annotations

from dualpath.runtime.server.app import create_app
from dualpath.runtime.server.config import ServerConfig
from dualpath.runtime.server.run import BackgroundServer, run_server, serve_in_background
from dualpath.runtime.server.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer

__all__ = ["BackgroundServer", "CharTokenizer", "HFTokenizer", "ServerConfig", "Tokenizer",
           "create_app", "load_tokenizer", "run_server", "serve_in_background"]
