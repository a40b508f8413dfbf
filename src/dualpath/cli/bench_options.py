"""The flags of ``dualpath bench``: one field per flag (its default, help and type); the command
receives one ``BenchOptions`` (``cli.option_fields``) and builds its ``BenchConfig`` from it
(``to_config``). Every flag's default is ``BenchConfig``'s."""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.bench.config import DATASETS, BenchConfig
from dualpath.cli._common import choices_help
from dualpath.cli.option_fields import option

_D = BenchConfig()  # every flag's default is BenchConfig's


@dataclass(frozen=True)
class BenchOptions:
    """``dualpath bench``'s flags (vLLM's names where ``vllm bench serve`` has the flag)."""

    base_url: str = option(
        _D.url,
        "--base-url",
        "--url",
        help="Server base URL without /v1 (ours, vLLM, SGLang).",
    )
    model: str = option(None, help="Model name (default: the first of /v1/models).")
    dataset_name: str = option(
        _D.dataset_name,
        help=choices_help(
            "agents (multi-turn agents), mooncake (a Mooncake JSONL trace at its own timing) or random",
            DATASETS,
        ),
    )
    dataset_path: str = option(None, help="The Mooncake JSONL trace (mooncake only).")
    agents: int = option(
        _D.num_agents,
        help="agents: number of agents (each sends one request per turn; clones beyond the trajectory set).",
    )
    maxlen: str = option(
        f"{_D.maxlen // 1024}k" if _D.maxlen % 1024 == 0 else str(_D.maxlen),
        help="agents: longest context of a trajectory (any "
        "size, e.g. 512, 8k, 32k); capped by the endpoint's context.",
    )
    trace: str = option(
        _D.trace, help="agents: synthetic, or a trace name/path whose sessions become agents."
    )
    max_turns: int = option(None, help="agents: cap on turns per agent.")
    num_prompts: int = option(
        None, help="mooncake: first N records (default all); random: N prompts (default 8)."
    )
    input_len: int = option(_D.input_len, help="random: prompt tokens per request.")
    output_len: int = option(
        None, help="Output tokens of every request/turn (default: the dataset's; random: 16)."
    )
    block_len: int = option(
        _D.block_len,
        help="mooncake: tokens sent per 512-token hash block (smaller sizes the trace down, sharing kept).",
    )
    time_scale: float = option(_D.time_scale, help="mooncake: replay speed-up (2 = twice as fast).")
    request_rate: float = option(
        _D.request_rate,
        "--request-rate",
        "--aps",
        help="Arrivals per second (agents: agent arrivals; inf: all at once, mooncake: the trace's timing).",
    )
    burstiness: float = option(_D.burstiness, help="Gamma shape of arrival gaps (1 = Poisson).")
    max_concurrency: int = option(None, help="Most requests in flight (default: no cap).")
    seed: int = option(_D.seed, help="Seed of trajectories, token ids and arrivals.")
    scale: float = option(
        None, help="agents (synthetic): scale of every append and generation (default: fit --maxlen)."
    )
    token_seed: int = option(
        None, help="Seed of the token ids alone (default: --seed): same lengths, fresh tokens."
    )
    max_context: int = option(None, help="Context limit in tokens (default: the endpoint's max_model_len).")
    request_timeout: float = option(
        _D.request_timeout_s, help="Seconds one request may take, send to last token, before it fails."
    )
    duration: float = option(_D.duration_s, help="Stop the run after this many seconds.")
    ttft_slo: float = option(_D.ttft_slo_s, help="TTFT SLO in seconds (goodput, attainment).")
    tpot_slo_ms: float = option(_D.tpot_slo_s * 1e3, help="TPOT SLO in milliseconds.")
    percentile_metrics: str = option(
        _D.percentile_metrics, help="Metrics to report (vLLM names + ttst, jct)."
    )
    metric_percentiles: str = option(_D.metric_percentiles, help="Percentiles to report, e.g. 50,90,99.")
    api_key: str = option(None, envvar="DUALPATH_API_KEY", help="Bearer API key.")
    save_result: bool = option(
        False, "--save-result", help="Write the result JSON (and a CDF plot beside it)."
    )
    save_detailed: bool = option(
        False, "--save-detailed", help="Add per-request lists (input_lens, ttfts, itls, errors, ...)."
    )
    result_dir: str = option(None, help="Folder of the result JSON (default: .).")
    result_filename: str = option(
        None, help="Name of the result JSON (default: {label}-{rate}qps-{model}-{date}.json)."
    )
    label: str = option("dualpath", help="Label in the result and its file name.")
    allow_failures: bool = option(False, "--allow-failures", help="Exit 0 even when requests failed.")
    json_out: bool = option(False, "--json", help="Print the result as one JSON object.")

    def to_config(self) -> BenchConfig:
        """The run's ``BenchConfig`` (--maxlen parsed; a bad size: a ConfigError naming it)."""
        from dualpath.core.errors import ConfigError
        from dualpath.core.units import parse_tokens

        try:
            maxlen_tokens = parse_tokens(self.maxlen)
        except ConfigError as exc:
            raise ConfigError("maxlen", self.maxlen, exc.reason) from None
        return BenchConfig(
            url=self.base_url.rstrip("/"),
            dataset_name=self.dataset_name,
            dataset_path=self.dataset_path,
            num_agents=self.agents,
            maxlen=maxlen_tokens,
            trace=self.trace,
            num_prompts=self.num_prompts,
            input_len=self.input_len,
            output_len=self.output_len,
            block_len=self.block_len,
            time_scale=self.time_scale,
            request_rate=self.request_rate,
            burstiness=self.burstiness,
            max_concurrency=self.max_concurrency,
            model=self.model,
            api_key=self.api_key,
            max_context_len=self.max_context,
            max_turns=self.max_turns,
            seed=self.seed,
            length_scale=self.scale,
            token_seed=self.token_seed,
            ttft_slo_s=self.ttft_slo,
            tpot_slo_s=self.tpot_slo_ms / 1e3,
            duration_s=self.duration,
            request_timeout_s=self.request_timeout,
            percentile_metrics=self.percentile_metrics,
            metric_percentiles=self.metric_percentiles,
        )
