"""deploy/grafana/dualpath.json queries only metrics (and labels) a running server exports.

A real local 1P1D cluster (tiny random model) behind the HTTP server serves two requests (the
second hits the first's persisted KV); then every metric name in every panel's PromQL must be a
sample name on ``/metrics`` and every label the query selects or groups by must be on that metric.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dualpath.runtime.cluster.config import ClusterConfig, SchedulerServiceConfig, TrafficConfig
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.server import BackgroundServer, CharTokenizer, ServerConfig, create_app

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "dualpath.json"
# Labels Prometheus adds at scrape time, and the histogram bucket label.
SCRAPE_LABELS = {"job", "instance", "le"}
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _panels(dash: dict) -> Iterator[dict]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dash: dict) -> list[str]:
    return [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, labels matched) of every selector; every metric is written with braces."""
    return [(m.group(1), set(_MATCHER.findall(m.group(2)))) for m in _SELECTOR.finditer(expr)]


def grouping_labels(expr: str) -> set[str]:
    return {lb.strip() for m in _GROUPING.finditer(expr) for lb in m.group(1).split(",") if lb.strip()}


def test_dashboard_is_grafana_json_over_prometheus() -> None:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dash["schemaVersion"] >= 36 and dash["title"] and dash["uid"]
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    panels = [p for p in _panels(dash) if p["type"] != "row"]
    assert panels and all(p["type"] == "timeseries" for p in panels)
    assert all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in panels)
    ids = [p["id"] for p in _panels(dash)]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in panels:  # panels do not overlap on the 24-column grid
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, p["title"]
        cells |= mine
    for expr in queries(dash):
        found = selectors(expr)
        assert found, expr
        # a bare metric name (no braces) would escape the check below
        assert len(re.findall(r"\bdualpath_\w+", expr)) == len(found), expr
        for open_, close in ("()", "{}", "[]"):
            assert expr.count(open_) == expr.count(close), expr


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Sample name -> label names, from /metrics of a server over a real cluster after traffic."""
    cfg = ClusterConfig(
        kv_dir=str(tmp_path_factory.mktemp("kv")),
        model="tiny",
        num_prefill_engines=1,
        num_decode_engines=1,
        traffic=TrafficConfig(snic_gbps=1.0),
        scheduler=SchedulerServiceConfig(engine_timeout_s=60.0),
    )  # a loaded 2-core machine stalls engines for seconds
    with LocalCluster(cfg) as cluster:
        app = create_app(
            cluster.address,
            CharTokenizer(vocab_size=512),
            ServerConfig(model_name="tiny", cluster_query_timeout_s=60.0),
        )
        with BackgroundServer(app) as srv:
            prompt = [(5 * i) % 500 + 3 for i in range(96)]
            for _ in range(2):  # the second request reuses the first one's persisted blocks
                r = httpx.post(
                    srv.url + "/v1/completions",
                    timeout=120,
                    json={
                        "model": "tiny",
                        "prompt": prompt,
                        "max_tokens": 4,
                        "temperature": 0,
                        "ignore_eos": True,
                    },
                )
                assert r.status_code == 200, r.text
            # Byte counters ride on the engines' heartbeats: until one arrives after the
            # traffic, kv/nic bytes have no series. Scrape until the cluster answered with them.
            wanted = (
                "\ndualpath_cluster_up 1.0",
                "\ndualpath_kv_bytes_total{",
                "\ndualpath_nic_bytes_total{",
            )
            for _ in range(120):
                text = httpx.get(srv.url + "/metrics", timeout=120).text
                if all(w in text for w in wanted):
                    break
                time.sleep(0.5)
            assert all(w in text for w in wanted), text
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, set()).update(s.labels)
    return samples


def test_every_dashboard_query_names_an_exported_metric(scraped: dict[str, set[str]]) -> None:
    dash = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    used: set[str] = set()
    for expr in queries(dash):
        names = set()
        for name, labels in selectors(expr):
            assert name in scraped, f"{name} (in {expr!r}) is not on /metrics"
            assert labels - SCRAPE_LABELS <= scraped[name], (name, labels, scraped[name])
            names.add(name)
        have = set().union(*(scraped[n] for n in names))
        assert grouping_labels(expr) - SCRAPE_LABELS <= have, expr
        used |= names
    for var in dash["templating"]["list"]:
        m = re.search(r"label_values\((\w+)", var["query"]["query"])
        assert m and m.group(1) in scraped, var["query"]
    # the panels the issue asks for: TTFT/TTST/TPOT, queues, bytes per path and NIC, hits, engines
    for wanted in (
        "dualpath_ttft_seconds_bucket",
        "dualpath_ttst_seconds_bucket",
        "dualpath_tpot_seconds_bucket",
        "dualpath_queue_depth",
        "dualpath_kv_bytes_total",
        "dualpath_nic_bytes_total",
        "dualpath_store_hit_tokens_total",
        "dualpath_engines_alive",
        "dualpath_engine_deaths_total",
        "dualpath_engine_revivals_total",
    ):
        assert wanted in used, wanted


def test_the_check_catches_a_wrong_name(scraped: dict[str, set[str]]) -> None:
    """The extractor sees through functions and ranges, so a typo would fail the test above."""
    expr = 'sum by (path) (rate(dualpath_kv_byte_total{job=~"$job"}[$__rate_interval]))'
    assert selectors(expr) == [("dualpath_kv_byte_total", {"job"})]
    assert "dualpath_kv_byte_total" not in scraped and "dualpath_kv_bytes_total" in scraped
    assert grouping_labels(expr) == {"path"} and "path" in scraped["dualpath_kv_bytes_total"]
