"""BenchConfig: one frozen, validated description of a benchmark run (no I/O).

Field names follow ``vllm bench serve``'s flags where they mean the same (``url`` is its
``--base-url``; ``num_prompts``, ``request_rate``, ``burstiness``, ``max_concurrency``, ``seed``,
``percentile_metrics``, ``metric_percentiles``); the agent fields are dualpath's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dualpath.core.errors import require

DATASETS = ("agents", "mooncake", "random")
METRICS = ("ttft", "tpot", "itl", "e2el", "ttst", "jct")  # jct: agents dataset only
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl,e2el,ttst,jct"


def parse_metric_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for n in names:
        require(n in METRICS, "percentile_metrics", text, f"{n!r} is not one of {','.join(METRICS)}")
    require(len(names) > 0, "percentile_metrics", text, "must name at least one metric")
    return names


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        values = ()
    require(
        len(values) > 0 and all(0 < p <= 100 for p in values),
        "metric_percentiles",
        text,
        "must be comma-separated percentiles in (0, 100], e.g. 50,90,99",
    )
    return values


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """A run against the OpenAI-compatible server at ``url`` (scheme://host:port, no /v1).

    ``dataset_name``: "agents" (multi-turn agents: ``num_agents`` trajectories from ``trace`` =
    "synthetic" (the ``maxlen`` generator of dualpath.workload, any ``maxlen`` >= 2 tokens) or a
    trace name/path; turn i+1's prompt extends turn i's context), "mooncake" (the Mooncake JSONL at
    ``dataset_path`` replayed request by request at its own timestamps divided by ``time_scale``;
    prompts built from ``hash_ids``, ``block_len`` tokens per hash block), or "random"
    (``num_prompts`` independent prompts of ``input_len`` random tokens). ``num_prompts`` cuts the
    mooncake trace / sizes the random set (agents: None; the agents' turns are the requests).
    ``request_rate``: arrivals per second (inf = all at once); agents: agent arrivals, later turns
    follow their predecessor; mooncake: inf keeps the trace's timing, a finite rate replaces it.
    Arrival gaps are gamma(``burstiness``) (1 = Poisson), seeded by ``seed``, like vLLM's.
    ``max_concurrency`` caps requests in flight (None: no cap). ``output_len`` overrides every
    request's output length. Agents are scaled to ``max_context_len`` (None: the endpoint's
    ``max_model_len``) then truncated to it; ``max_turns`` caps turns per agent. ``duration_s``
    bounds the run (requests still running then fail as cancelled); ``request_timeout_s`` bounds
    each request (send to last token). SLO/goodput: TTFT <= ``ttft_slo_s`` and TPOT <=
    ``tpot_slo_s``.
    """

    url: str = "http://127.0.0.1:8000"
    dataset_name: str = "agents"
    dataset_path: str | None = None
    num_agents: int = 4
    maxlen: int = 32768
    trace: str = "synthetic"
    num_prompts: int | None = None
    input_len: int = 256
    output_len: int | None = None
    block_len: int = 512
    time_scale: float = 1.0
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    model: str | None = None
    api_key: str | None = None
    max_context_len: int | None = None
    max_turns: int | None = None
    seed: int = 0
    length_scale: float | None = None
    token_seed: int | None = None
    ttft_slo_s: float = 4.0
    tpot_slo_s: float = 0.05
    duration_s: float = 600.0
    request_timeout_s: float = 300.0
    vocab_size: int | None = None
    min_token_id: int = 16
    max_retries_429: int = 20
    percentile_metrics: str = DEFAULT_PERCENTILE_METRICS
    metric_percentiles: str = "99"

    def __post_init__(self) -> None:
        self._check_source()
        self._check_lengths()
        self._check_pacing()
        self._check_agents()
        self._check_limits()

    def _check_source(self) -> None:
        """The server URL and the dataset (its path, how it is sized)."""
        require(
            self.url.startswith(("http://", "https://")),
            "url",
            self.url,
            "must be an explicit http(s):// URL of an OpenAI-compatible server",
        )
        require(
            self.dataset_name in DATASETS,
            "dataset_name",
            self.dataset_name,
            f"must be one of {', '.join(DATASETS)}",
        )
        require(
            (self.dataset_name == "mooncake") == (self.dataset_path is not None),
            "dataset_path",
            self.dataset_path,
            "is needed by --dataset-name mooncake and only by it",
        )
        require(
            self.dataset_name != "agents" or self.num_prompts is None,
            "num_prompts",
            self.num_prompts,
            "counts requests of the mooncake/random datasets; agent replay "
            "is sized by --agents (and --max-turns)",
        )
        require(
            self.num_prompts is None or self.num_prompts >= 1, "num_prompts", self.num_prompts, "must be >= 1"
        )
        require(1 <= self.num_agents <= 100_000, "num_agents", self.num_agents, "must be in [1, 100000]")

    def _check_lengths(self) -> None:
        """Token lengths of the prompts, the outputs and the hash blocks."""
        require(
            self.maxlen >= 2,
            "maxlen",
            self.maxlen,
            "must be >= 2 tokens (one prompt token and one generated token)",
        )
        require(self.input_len >= 1, "input_len", self.input_len, "must be >= 1 token")
        require(
            self.output_len is None or self.output_len >= 1,
            "output_len",
            self.output_len,
            "must be >= 1 token",
        )
        require(self.block_len >= 1, "block_len", self.block_len, "must be >= 1 token per hash block")

    def _check_pacing(self) -> None:
        """How requests are paced: trace speed, rate, burstiness, concurrency cap."""
        require(
            math.isfinite(self.time_scale) and self.time_scale > 0,
            "time_scale",
            self.time_scale,
            "must be > 0 (2 = replay the trace twice as fast)",
        )
        require(
            self.request_rate > 0,
            "request_rate",
            self.request_rate,
            "must be > 0 per second (inf: all at once)",
        )
        require(
            math.isfinite(self.burstiness) and self.burstiness > 0,
            "burstiness",
            self.burstiness,
            "must be > 0 (1 = Poisson)",
        )
        require(
            self.max_concurrency is None or self.max_concurrency >= 1,
            "max_concurrency",
            self.max_concurrency,
            "must be >= 1 (or omitted: no cap)",
        )

    def _check_agents(self) -> None:
        """The agent replay: context cap, turns, length scale, token seed."""
        require(
            self.max_context_len is None or self.max_context_len >= 2,
            "max_context_len",
            self.max_context_len,
            "must be >= 2 tokens",
        )
        require(self.max_turns is None or self.max_turns >= 1, "max_turns", self.max_turns, "must be >= 1")
        require(
            self.length_scale is None or 0 < self.length_scale <= 1,
            "length_scale",
            self.length_scale,
            "must be in (0, 1]",
        )
        require(
            self.length_scale is None or self.trace == "synthetic",
            "length_scale",
            self.length_scale,
            "applies to synthetic agents only (traces are fitted to the context)",
        )
        require(
            self.token_seed is None or self.token_seed >= 0, "token_seed", self.token_seed, "must be >= 0"
        )

    def _check_limits(self) -> None:
        """SLOs, duration, timeouts, token ids, retries and the reported metrics."""
        require(self.ttft_slo_s > 0, "ttft_slo_s", self.ttft_slo_s, "must be > 0")
        require(self.tpot_slo_s > 0, "tpot_slo_s", self.tpot_slo_s, "must be > 0")
        require(self.duration_s > 0, "duration_s", self.duration_s, "must be > 0")
        require(
            math.isfinite(self.request_timeout_s) and self.request_timeout_s > 0,
            "request_timeout_s",
            self.request_timeout_s,
            "must be > 0 seconds",
        )
        require(
            self.vocab_size is None or self.vocab_size > self.min_token_id,
            "vocab_size",
            self.vocab_size,
            f"must exceed min_token_id ({self.min_token_id})",
        )
        require(self.min_token_id >= 0, "min_token_id", self.min_token_id, "must be >= 0")
        require(self.max_retries_429 >= 0, "max_retries_429", self.max_retries_429, "must be >= 0")
        parse_metric_list(self.percentile_metrics)
        parse_percentiles(self.metric_percentiles)

    @property
    def tokens_seed(self) -> int:
        """The seed of token ids (``token_seed``, else ``seed``)."""
        return self.seed if self.token_seed is None else self.token_seed

    @property
    def mode(self) -> str:
        """offline: everything starts at once; online: arrivals at ``request_rate`` or trace timing."""
        if self.dataset_name == "mooncake":
            return "trace-timed" if math.isinf(self.request_rate) else "online"
        return "offline" if math.isinf(self.request_rate) else "online"

    @property
    def metrics(self) -> tuple[str, ...]:
        """Percentile metrics to report (jct only where there are agents)."""
        names = parse_metric_list(self.percentile_metrics)
        return tuple(n for n in names if n != "jct" or self.dataset_name == "agents")

    @property
    def percentiles(self) -> tuple[float, ...]:
        return parse_percentiles(self.metric_percentiles)
