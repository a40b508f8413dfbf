"""The console summary: ``vllm bench serve``'s result block, line for line, then the agent metrics,
the server's cache hit rate and every failure reason with its count."""

from __future__ import annotations

import re
from typing import Any

WIDTH = 50
HEADERS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
    "ttst": ("TTST", "Time to Second Token"),
    "jct": ("JCT", "Agent Job Completion Time"),
}


def _line(label: str, value: Any, fmt: str = ".2f") -> str:
    if value is None:
        text = "n/a"
    elif isinstance(value, float) and fmt:
        text = format(value, fmt)
    else:
        text = str(value)
    return f"{label:<40} {text:<10}"


def _rule(title: str, fill: str) -> str:
    return f"{title:{fill}^{WIDTH}}"


def _metric_lines(result: dict[str, Any], name: str) -> list[str]:
    short, header = HEADERS[name]
    keys = [k for k in result if re.fullmatch(rf"p[0-9.]+_{name}_ms", k)]
    lines = [
        _rule(header, "-"),
        _line(f"Mean {short} (ms):", result.get(f"mean_{name}_ms")),
        _line(f"Median {short} (ms):", result.get(f"median_{name}_ms")),
    ]
    lines += [_line(f"P{k.split('_', 1)[0][1:]} {short} (ms):", result[k]) for k in keys]
    if result.get(f"mean_{name}_ms") is None:
        lines.append(
            "  (no samples: "
            + ("no agent finished every turn" if name == "jct" else "every answer was one token")
            + ")"
        )
    return lines


def format_summary(result: dict[str, Any], metrics: tuple[str, ...]) -> str:
    """The whole block as text (no trailing newline)."""
    lines = _throughput_lines(result)
    if not result["completed"]:
        lines += [_rule("Latency", "-"), "  (no successful request: no latency to report)"]
    for name in metrics if result["completed"] else ():
        if name != "jct":
            lines += _metric_lines(result, name)
    lines += _agent_lines(result, metrics)
    lines += _slo_cache_lines(result)
    lines += _failure_lines(result)
    lines.append("=" * WIDTH)
    return "\n".join(line.rstrip() for line in lines)


def _throughput_lines(result: dict[str, Any]) -> list[str]:
    """The header: request counts, the configured pacing, tokens and throughputs."""
    lines = [
        _rule(" Serving Benchmark Result ", "="),
        _line("Successful requests:", result["completed"]),
        _line("Failed requests:", result["failed"]),
    ]
    if result.get("max_concurrency") is not None:
        lines.append(_line("Maximum request concurrency:", result["max_concurrency"]))
    if result.get("request_rate") != "inf":
        lines.append(_line("Request rate configured (RPS):", float(result["request_rate"])))
    return lines + [
        _line("Benchmark duration (s):", result["duration"]),
        _line("Total input tokens:", result["total_input_tokens"]),
        _line("Total generated tokens:", result["total_output_tokens"]),
        _line("Request throughput (req/s):", result["request_throughput"]),
        _line("Request goodput (req/s):", result["request_goodput"]),
        _line("Output token throughput (tok/s):", result["output_throughput"]),
        _line("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"]),
        _line("Peak concurrent requests:", float(result["max_concurrent_requests"])),
        _line("Total token throughput (tok/s):", result["total_token_throughput"]),
    ]


def _agent_lines(result: dict[str, Any], metrics: tuple[str, ...]) -> list[str]:
    """Agent replay only: agents completed, their throughput and the JCT percentiles."""
    if result.get("num_agents") is None:
        return []
    lines = [
        _rule("Agents", "-"),
        _line("Agents completed:", f"{result['agents_completed']}/{result['num_agents']}"),
        _line("Agent throughput (agents/s):", result["agent_throughput"], ".3f"),
    ]
    if "jct" in metrics and result["completed"]:
        lines += _metric_lines(result, "jct")[1:]
    return lines


def _slo_cache_lines(result: dict[str, Any]) -> list[str]:
    """SLO attainment, the server's cache hit rate (or why there is none), truncated requests."""
    lines = [
        _rule("SLO and cache", "-"),
        _line(
            "SLO attainment:",
            f"{result['slo_attainment']:.1%} (TTFT <= "
            f"{result['ttft_slo_ms']:g} ms and TPOT <= {result['tpot_slo_ms']:g} ms)",
        ),
    ]
    rate = result.get("cache_hit_rate")
    if rate is None:
        why = "no prompt tokens counted" if result.get("cache_counters") else "not reported by the server"
        lines.append(_line("Server cache hit rate:", f"n/a ({why})"))
    else:
        lines.append(
            _line(
                "Server cache hit rate:",
                f"{rate:.1%} ({result['cache_hit_tokens']:.0f}"
                f" of {result['cache_query_tokens']:.0f} prompt tokens)",
            )
        )
    if result.get("truncated_requests"):
        lines.append(_line("Requests cut to fit the context:", result["truncated_requests"]))
    return lines


def _failure_lines(result: dict[str, Any]) -> list[str]:
    """The failures by reason, with a hint for the known ones."""
    reasons = result.get("failure_reasons") or {}
    if not reasons:
        return []
    lines = [_rule(f" Failures ({result['failed']} requests) ", "-")]
    lines += [f"{count:>6} x {reason}" for reason, count in reasons.items()]
    return lines + [f"  hint: {hint}" for hint in _hints(reasons)]


def _hints(reasons: dict[str, int]) -> list[str]:
    text = " ".join(reasons)
    out = []
    if "no token from the cluster within" in text:
        out.append(
            "the server gave up waiting for a first token (its token timeout): prompts "
            "are too long for its prefill speed; size the run down (--maxlen 512, "
            "--max-turns, --output-len; docs/bench.md has a CPU example)"
        )
    if "request timeout" in text:
        out.append("raise --request-timeout, or size the run down (--maxlen, --output-len)")
    if "cancelled at the duration limit" in text or "not sent before" in text:
        out.append("the run hit --duration; raise it or send fewer requests")
    return out
