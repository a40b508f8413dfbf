"""/metrics exposition of the KV store counters from a cluster snapshot."""

from __future__ import annotations

from dualpath.runtime.cluster.api import MetricsSnapshot
from dualpath.runtime.server.metrics import ServerMetrics


def _snap(**kw: object) -> MetricsSnapshot:
    base = dict(
        num_requests=1,
        num_finished=1,
        num_failed=0,
        hit_tokens=64,
        prompt_tokens=394,
        generated_tokens=4,
        bytes_by_path={},
        bytes_by_nic={},
        queue_depths={},
        ttft_s=[],
        ttst_s=[],
        tpot_s=[],
        e2e_s=[],
    )
    return MetricsSnapshot(**(base | kw))  # type: ignore[arg-type]


def test_store_counters_and_write_errors_by_cause() -> None:
    m = ServerMetrics()
    m.update(
        _snap(
            store_counts={
                "corrupt_blocks": 1,
                "evictions": 33,
                "rewritten_blocks": 1,
                "written_blocks": 60,
                "failed_hit_tokens": 256,
            },
            store_write_errors={"ENOSPC": 6, "ENOTDIR": 8},
        )
    )
    text = m.render().decode()
    for line in (
        "dualpath_store_hit_tokens_total 64.0",
        "dualpath_store_corrupt_blocks_total 1.0",
        "dualpath_store_evictions_total 33.0",
        "dualpath_store_rewritten_blocks_total 1.0",
        "dualpath_store_written_blocks_total 60.0",
        "dualpath_store_failed_hit_tokens_total 256.0",
        'dualpath_store_write_errors_total{cause="ENOSPC"} 6.0',
        'dualpath_store_write_errors_total{cause="ENOTDIR"} 8.0',
    ):
        assert line in text, line


def test_store_counters_are_zero_before_any_event() -> None:
    m = ServerMetrics()
    m.update(_snap())
    text = m.render().decode()
    assert "dualpath_store_corrupt_blocks_total 0.0" in text
    assert "dualpath_store_write_errors_total{" not in text  # no cause seen yet, no series
