"""The server's own prefix-cache counters, read from its Prometheus ``/metrics`` before and after.

Known counter pairs (hit tokens, queried tokens): dualpath serve's store counters and vLLM's prefix
cache counters. The hit rate of the run is ``delta hits / delta queried``. A server without
``/metrics``, or without either pair, or with no queried tokens during the run, reports None (the
result's ``cache_hit_rate`` is then null): never an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

# (hit-token counter, queried-token counter, who exports them)
CACHE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("dualpath_store_hit_tokens_total", "dualpath_prompt_tokens_total", "dualpath"),
    ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheHits:
    """Prompt tokens the server served from its cache during the run, out of ``query_tokens``."""

    source: str
    hit_tokens: float
    query_tokens: float

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens > 0 else None


def parse_counters(text: str) -> dict[str, float]:
    """Prometheus text format -> metric name: value, summed over label sets (comments skipped)."""
    out: dict[str, float] = {}
    for (name, _labels), value in parse_series(text).items():
        out[name] = out.get(name, 0.0) + value
    return out


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    """``a="x",b="y"`` -> (("a", "x"), ("b", "y")) (values unescaped; commas inside quotes kept)."""
    out, i = [], 0
    while i < len(text):
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= len(text) or text[eq + 1] != '"':
            break
        key, j, value = text[i:eq].strip().lstrip(","), eq + 2, []
        while j < len(text) and text[j] != '"':
            if text[j] == "\\" and j + 1 < len(text):
                j += 1
                value.append({"n": "\n"}.get(text[j], text[j]))
            else:
                value.append(text[j])
            j += 1
        out.append((key.strip(), "".join(value)))
        i = j + 1
    return tuple(out)


def parse_series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text format -> (metric name, its label pairs): value (comments skipped)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        labels: tuple[tuple[str, str], ...] = ()
        if "{" in line:  # name{labels} value [timestamp]; label values may hold spaces
            name_part, _, tail = line.partition("{")
            inside, _, rest = tail.rpartition("}")
            labels = _labels(inside)
        else:
            name_part, _, rest = line.partition(" ")
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        key = (name_part.strip(), labels)
        out[key] = out.get(key, 0.0) + value
    return out


def by_label(
    series: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, label: str
) -> dict[str, float]:
    """The values of metric ``name`` keyed by its ``label`` (summed over other labels)."""
    out: dict[str, float] = {}
    for (metric, labels), value in series.items():
        if metric == name:
            for key, text in labels:
                if key == label:
                    out[text] = out.get(text, 0.0) + value
    return out


async def scrape_text(http: httpx.AsyncClient, url: str) -> str | None:
    """The server's ``/metrics`` text now, or None when it has none readable."""
    try:
        resp = await http.get(url + "/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    return resp.text if resp.status_code == 200 else None


async def scrape(http: httpx.AsyncClient, url: str) -> dict[str, float] | None:
    """The server's counters now (summed over labels), or None when it has no readable ``/metrics``."""
    text = await scrape_text(http, url)
    return None if text is None else parse_counters(text)


def cache_hits(before: dict[str, float] | None, after: dict[str, float] | None) -> CacheHits | None:
    """The first known counter pair present in both scrapes, as a delta; None if none is."""
    if before is None or after is None:
        return None
    for hit, query, source in CACHE_COUNTERS:
        if all(k in before and k in after for k in (hit, query)):
            return CacheHits(
                source=source, hit_tokens=after[hit] - before[hit], query_tokens=after[query] - before[query]
            )
    return None
