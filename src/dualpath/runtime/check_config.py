"""``dualpath check``'s config, torch-free: the CLI reads its defaults and path choices here.

Paths: ``pe``, ``de`` and ``split`` (one conversation on that read path; split divides the hits
between PE and DE), ``mixed`` (two conversations batched together, on opposite paths that swap
every turn). Each turn sends the next of ``MESSAGES`` (``OTHER_MESSAGES`` for mixed's second).
``transport``: how KV moves between the engines (``CHECK_TRANSPORTS``: "inproc", a call; or a
cross-process transport, one per engine, so the check covers its wire). ``kv_backend``: where the
store keeps the blocks the turns reload (``KV_BACKEND_NAMES``; mooncake starts a store for the run).
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.runtime.choices import KV_BACKEND_NAMES, TRANSPORT_NAMES
from dualpath.spec.clusters import DEFAULT_RUNTIME_MODEL

PATHS = ("pe", "de", "split", "mixed")  # the choices
CHECK_TRANSPORTS = ("inproc", *TRANSPORT_NAMES)  # = runtime.engine.local.LOCAL_TRANSPORTS
DEFAULT_PATHS = ("pe", "de", "mixed")  # what `dualpath check` runs unless told (split: ask for it)
MESSAGES = (
    "What is the capital of France? Answer in one sentence.",
    "And which river flows through it?",
    "Name one famous bridge over that river.",
    "How long is the river?",
    "Thanks. Summarise our conversation.",
)
OTHER_MESSAGES = (
    "Write a haiku about the sea.",
    "Now one about mountains.",
    "And one about rain.",
    "Which of them do you like best?",
    "Why?",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckConfig:
    model: str = DEFAULT_RUNTIME_MODEL
    turns: int = 3
    paths: tuple[str, ...] = DEFAULT_PATHS
    block_size: int = 16
    gen_len: int = 8
    tolerance: float = 1e-5  # of the logits' scale (max |logit|); why: runtime/engine/check.py
    device: str = "cpu"
    transport: str = "inproc"
    kv_backend: str = "posix"

    def __post_init__(self) -> None:
        require(1 <= self.turns <= len(MESSAGES), "turns", self.turns, f"must be in [1, {len(MESSAGES)}]")
        for p in self.paths:
            require(p in PATHS, "paths", p, f"choices: {', '.join(PATHS)}")
        require(self.transport in CHECK_TRANSPORTS, "transport", self.transport,
                f"choices: {', '.join(CHECK_TRANSPORTS)}")  # fmt: skip
        require(self.kv_backend in KV_BACKEND_NAMES, "kv_backend", self.kv_backend,
                f"choices: {', '.join(KV_BACKEND_NAMES)}")  # fmt: skip
