"""BenchConfig: one frozen, validated description of an agent-replay benchmark run (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import require


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """Replay ``num_agents`` agents against the OpenAI-compatible server at ``url``.

    ``trace``: "synthetic" (``maxlen`` bucket of dualpath.workload's generator), "mooncake", or a
    trace name/path of dualpath.workload. ``aps``: agents per second (Poisson arrivals, online
    mode); None = offline (all agents start at once; JCT). Trajectories are scaled by
    ``max_context_len / maxlen`` when the endpoint's context is shorter, then truncated to it
    (``max_context_len`` None: the endpoint's ``max_model_len`` from /v1/models, else ``maxlen``).
    ``max_turns`` caps turns per agent, ``duration_s`` the whole run (unfinished agents are
    counted, not waited for). Prompt tokens are random ids in [``min_token_id``, ``vocab_size``)
    (``vocab_size`` None: the endpoint's, else 1000). SLO: TTFT <= ``ttft_slo_s`` and TPOT <=
    ``tpot_slo_s``.
    """

    url: str = "http://127.0.0.1:8000"
    num_agents: int = 4
    maxlen: int = 8192
    aps: float | None = None
    trace: str = "synthetic"
    model: str | None = None
    api_key: str | None = None
    max_context_len: int | None = None
    max_turns: int | None = None
    seed: int = 0
    ttft_slo_s: float = 4.0
    tpot_slo_s: float = 0.05
    duration_s: float = 600.0
    request_timeout_s: float = 300.0
    vocab_size: int | None = None
    min_token_id: int = 16
    max_retries_429: int = 20

    def __post_init__(self) -> None:
        require(self.url.startswith(("http://", "https://")), "url", self.url,
                "must be an explicit http(s):// URL of an OpenAI-compatible server")
        require(1 <= self.num_agents <= 100_000, "num_agents", self.num_agents, "must be in [1, 100000]")
        require(self.maxlen >= 4096, "maxlen", self.maxlen, "must be >= 4096 tokens (e.g. 8k, 32k)")
        require(self.aps is None or self.aps > 0, "aps", self.aps, "must be > 0 (or omitted: offline)")
        require(self.max_context_len is None or self.max_context_len >= 16, "max_context_len",
                self.max_context_len, "must be >= 16 tokens")
        require(self.max_turns is None or self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        require(self.ttft_slo_s > 0, "ttft_slo_s", self.ttft_slo_s, "must be > 0")
        require(self.tpot_slo_s > 0, "tpot_slo_s", self.tpot_slo_s, "must be > 0")
        require(self.duration_s > 0, "duration_s", self.duration_s, "must be > 0")
        require(self.request_timeout_s > 0, "request_timeout_s", self.request_timeout_s, "must be > 0")
        require(self.vocab_size is None or self.vocab_size > self.min_token_id, "vocab_size",
                self.vocab_size, f"must exceed min_token_id ({self.min_token_id})")
        require(self.min_token_id >= 0, "min_token_id", self.min_token_id, "must be >= 0")
        require(self.max_retries_429 >= 0, "max_retries_429", self.max_retries_429, "must be >= 0")

    @property
    def mode(self) -> str:
        return "offline" if self.aps is None else "online"
