"""Prometheus metrics of the HTTP layer: latency histograms per request, cluster counters per scrape.

Histograms (TTFT, TTST, TPOT, end-to-end) are observed by the server for every request it serves
(times from the request's arrival at the server). Counters and gauges of the cluster (bytes per read
path and per NIC, store hits, queue depths) come from the latest ``MetricsSnapshot``, which the
``/metrics`` handler fetches before rendering. One registry per app (no global state).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dualpath.runtime.cluster.api import MetricsSnapshot, RequestStats

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
_TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _SnapshotCollector:
    """Exposes the last cluster snapshot (nothing before the first successful scrape)."""

    def __init__(self) -> None:
        self.snapshot: MetricsSnapshot | None = None
        self.cluster_up = 0
        self.resubmitted = 0  # the server's cluster client's count (ClusterClient.resubmitted)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("dualpath_cluster_up", "1 if the scheduler answered the last scrape")
        up.add_metric([], self.cluster_up)
        yield up
        again = CounterMetricFamily(
            "dualpath_requests_resubmitted",
            "Submissions again, to the restarted scheduler, of requests in flight when it died",
        )
        again.add_metric([], self.resubmitted)
        yield again
        snap = self.snapshot
        if snap is None:
            return
        yield from _labelled_families(snap)
        yield from _total_families(snap)
        yield from _store_families(snap)


def _labelled_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    """Per-path, per-NIC, per-role, per-cause and per-queue series."""
    by_path = CounterMetricFamily("dualpath_kv_bytes", "KV bytes moved per path", labels=["path"])
    for path, n in sorted(snap.bytes_by_path.items()):
        by_path.add_metric([path], n)
    yield by_path
    by_nic = CounterMetricFamily("dualpath_nic_bytes", "Bytes through each emulated NIC", labels=["nic"])
    for nic, n in sorted(snap.bytes_by_nic.items()):
        by_nic.add_metric([nic], n)
    yield by_nic
    alive = GaugeMetricFamily("dualpath_engines_alive", "Live engines per role", labels=["role"])
    for role, n in sorted(snap.engines_alive.items()):
        alive.add_metric([role], n)
    yield alive
    dropped = CounterMetricFamily(
        "dualpath_messages_dropped",
        "Cluster messages dropped as invalid, per plane and cause",
        labels=["plane", "cause"],
    )
    for key, n in sorted(snap.messages_dropped.items()):
        plane, _, cause = key.partition("/")
        dropped.add_metric([plane, cause], n)
    yield dropped
    restarts = CounterMetricFamily(
        "dualpath_process_restarts",
        "Cluster processes the supervisor restarted, per role",
        labels=["role"],
    )
    counts = {"scheduler": 0, "prefill": 0, "decode": 0} | dict(getattr(snap, "process_restarts", {}))
    for role, n in sorted(counts.items()):  # (every role from the start: a series from 0)
        restarts.add_metric([role], n)
    yield restarts
    queues = GaugeMetricFamily("dualpath_queue_depth", "Requests queued", labels=["queue"])
    for name, n in sorted(snap.queue_depths.items()):
        queues.add_metric([name], n)
    yield queues


def _total_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    """The cluster-wide token / request / engine counters."""
    for name, value, doc in (
        (
            "dualpath_store_hit_tokens",
            snap.hit_tokens,
            "Prompt tokens whose KV was read from the store and verified",
        ),
        ("dualpath_prompt_tokens", snap.prompt_tokens, "Prompt tokens of all requests"),
        ("dualpath_generated_tokens", snap.generated_tokens, "Tokens generated"),
        ("dualpath_cluster_requests", snap.num_requests, "Requests the scheduler received"),
        ("dualpath_cluster_finished", snap.num_finished, "Requests finished"),
        ("dualpath_cluster_failed", snap.num_failed, "Requests failed"),
        (
            "dualpath_cluster_cancelled",
            getattr(snap, "num_cancelled", 0),
            "Requests whose client went away before they finished",
        ),
        ("dualpath_engine_deaths", snap.engine_deaths, "Engines declared dead (missed heartbeats)"),
        (
            "dualpath_engine_revivals",
            snap.engine_revivals,
            "Engines declared dead that answered again and were taken back",
        ),
        (
            "dualpath_engine_request_failures",
            snap.engine_request_failures,
            "Requests an engine failed alone while it served the others on",
        ),
        (
            "dualpath_requests_retried",
            getattr(snap, "requests_retried", 0),
            "Requests re-dispatched after their engine was lost (resumed from the tokens they had)",
        ),
    ):
        fam = CounterMetricFamily(name, doc)
        fam.add_metric([], value)
        yield fam


_STORE_DOCS = {
    "corrupt_blocks": "KV blocks that failed verification (quarantined, recomputed)",
    "evictions": "KV blocks evicted (LRU leaves) for the capacity bound or disk space",
    "rewritten_blocks": "Quarantined or vanished KV blocks persisted again (healed)",
    "written_blocks": "KV blocks persisted",
    "refused_links": "Symlinks found in the KV directory where a block, shard or quarantine belongs (moved aside, never followed)",
    "failed_hit_tokens": "Prompt tokens the store index promised that did not load (recomputed)",
}


def _store_families(snap: MetricsSnapshot) -> Iterator[Metric]:
    for key, doc in _STORE_DOCS.items():
        fam = CounterMetricFamily(f"dualpath_store_{key}", doc)
        fam.add_metric([], snap.store_counts.get(key, 0))
        yield fam
    errors = CounterMetricFamily(
        "dualpath_store_write_errors",
        "Failed KV block writes by cause (errno name; the block is not cached)",
        labels=["cause"],
    )
    for cause, n in sorted(snap.store_write_errors.items()):
        errors.add_metric([cause], n)
    yield errors


class ServerMetrics:
    """All metrics of one app. ``observe_request`` per finished request, ``update`` per scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.ttft = Histogram(
            "dualpath_ttft_seconds", "Time to first token", buckets=_LATENCY_BUCKETS_S, registry=reg
        )
        self.ttst = Histogram(
            "dualpath_ttst_seconds", "Time to second token", buckets=_LATENCY_BUCKETS_S, registry=reg
        )
        self.tpot = Histogram(
            "dualpath_tpot_seconds",
            "Time per output token after the first",
            buckets=_TPOT_BUCKETS_S,
            registry=reg,
        )
        self.e2e = Histogram(
            "dualpath_e2e_seconds", "Request latency", buckets=_LATENCY_BUCKETS_S, registry=reg
        )
        self.http = Counter(
            "dualpath_http_requests",
            "HTTP answers by endpoint and status",
            ["endpoint", "status"],
            registry=reg,
        )
        self.read_side = Counter(
            "dualpath_requests_by_read_side", "Finished requests per KV read side", ["side"], registry=reg
        )
        self.tokens = Counter("dualpath_server_tokens", "Tokens through the API", ["kind"], registry=reg)
        self.connections_closed = Counter(
            "dualpath_http_connections_closed",
            "HTTP connections the server closed: header_timeout, evicted_idle (at the connection "
            "cap), refused_full (at the cap, all busy), body_timeout",
            ["reason"],
            registry=reg,
        )
        self.accept_errors = Counter(
            "dualpath_http_accept_errors", "Failed accepts of HTTP connections (fd exhaustion)", registry=reg
        )
        self._snap = _SnapshotCollector()
        reg.register(self._snap)  # type: ignore[arg-type]

    def observe_request(
        self, token_times_s: list[float], prompt_len: int, stats: RequestStats | None
    ) -> None:
        """Record one finished request from its server-side token times."""
        self.tokens.labels("prompt").inc(prompt_len)
        self.tokens.labels("completion").inc(len(token_times_s))
        if not token_times_s:
            return
        self.ttft.observe(token_times_s[0])
        self.e2e.observe(token_times_s[-1])
        if len(token_times_s) > 1:
            self.ttst.observe(token_times_s[1])
            span = token_times_s[-1] - token_times_s[0]
            self.tpot.observe(span / (len(token_times_s) - 1))
        if stats is not None:
            self.read_side.labels(stats.read_side).inc()

    def update(self, snapshot: MetricsSnapshot | None, resubmitted: int = 0) -> None:
        """Take the cluster's latest snapshot (None: the scheduler did not answer) and the number
        of requests the server's client resubmitted after scheduler restarts."""
        self._snap.cluster_up = 0 if snapshot is None else 1
        self._snap.resubmitted = resubmitted
        if snapshot is not None:
            self._snap.snapshot = snapshot

    def render(self) -> bytes:
        return generate_latest(self.registry)


def count_http(metrics: ServerMetrics, endpoint: str, status: Any) -> None:
    metrics.http.labels(endpoint, str(status)).inc()
