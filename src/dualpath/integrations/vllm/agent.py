"""The per-node agent beside vLLM instances: DE-path storage reads forwarded to a prefill instance,
and the node's per-path byte counters on ``/metrics``. No vLLM import.

One agent per node. ``POST /read`` (from a prefill instance's connector, DE read path) queues a
read of store blocks; one reader thread serves the node's read queue in order: for each layer it
reads every block's Layer Block through the node's emulated storage NIC (``snic_gbps`` per
direction, shared with every process naming the same ``snic_state_file``, as ``dualpath serve``'s
links) and forwards that layer to the prefill instance's inbox over the project's ZeroMQ transport
(one span item per layer: its intact leading blocks; a block that fails to read ends the good
prefix, a miss from there on). ``GET /metrics`` (prometheus-client) exports the DE-read and
forwarded bytes and, from the counters files the connectors of this node write
(``counters_file``), their PE-read bytes and the bytes they loaded or saved. Run::

    python -m dualpath.integrations.vllm.agent --model DIR --store-dir DIR --port 8401 \\
        [--snic-gbps 1 --snic-state-file /tmp/node1.snic] [--counters /tmp/node1-*.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily
from pydantic import BaseModel

from dualpath.integrations.vllm.layout import model_layout
from dualpath.runtime.kvstore import BandwidthLimiter, BlockStore
from dualpath.runtime.kvstore.bandwidth import wait_until
from dualpath.runtime.transfer import TransferItem
from dualpath.runtime.transfer.zmq_transport import ZmqTransport

log = logging.getLogger("dualpath.vllm.agent")
# connector counters (counters_file JSON; the file name ends in -prefill.json or -decode.json):
# (metric, the instance role it is taken from (None: every role), the connector's counter, help)
CONNECTOR_COUNTERS = (
    ("dualpath_vllm_pe_read_bytes", "prefill", "read_bytes", "Hit KV read from storage by this node's prefill connectors (PE read path)"),
    ("dualpath_vllm_forwarded_in_bytes", "prefill", "forwarded_in_bytes", "Hit KV received by this node's prefill connectors from agents (DE read path)"),
    ("dualpath_vllm_pd_kv_bytes", "decode", "read_bytes", "Prompt KV loaded by this node's decode connectors from the store (the prefill -> decode transfer)"),
    ("dualpath_vllm_saved_bytes", None, "written_bytes", "KV persisted to storage by this node's connectors"),
)  # fmt: skip


class ReadRequest(BaseModel):
    key: str
    hashes: list[str]
    address: str
    endpoint: str
    capped: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    key: str
    hashes: tuple[str, ...]
    address: str
    endpoint: str
    capped: bool = True


class _ConnectorFiles:
    """A prometheus collector over the JSON counters files of this node's connectors."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = patterns

    def collect(self) -> Any:
        totals = dict.fromkeys((c[0] for c in CONNECTOR_COUNTERS), 0)
        for path in sorted({p for pattern in self.patterns for p in glob.glob(pattern)}):
            if path.endswith(".tmp"):
                continue
            role = (
                "prefill"
                if path.endswith("-prefill.json")
                else "decode"
                if path.endswith("-decode.json")
                else ""
            )
            try:
                with open(path) as f:
                    found = json.load(f)
            except (OSError, ValueError):
                continue  # being replaced: the next scrape sees it
            for name, want, key, _ in CONNECTOR_COUNTERS:
                if want is None or want == role:
                    totals[name] += int(found.get(key, 0))
        for name, _, _, text in CONNECTOR_COUNTERS:
            yield CounterMetricFamily(name, text, value=totals[name])


class Agent:
    """The node's read queue (one reader thread) and its counters."""

    def __init__(self, store: BlockStore, *, node_id: int, limiter: BandwidthLimiter | None,
                 counters_files: list[str]) -> None:  # fmt: skip
        self.store, self.node_id, self.limiter = store, node_id, limiter
        self.transport = ZmqTransport()
        self.registry = reg = CollectorRegistry()
        self.de_read = Counter("dualpath_vllm_de_read_bytes", "Hit KV read from storage by this agent (DE read path)", registry=reg)  # fmt: skip
        self.forwarded = Counter("dualpath_vllm_forwarded_bytes", "Hit KV forwarded by this agent to prefill instances", registry=reg)  # fmt: skip
        self.misses = Counter("dualpath_vllm_de_read_misses", "Blocks that failed to read (a miss, recomputed)", registry=reg)  # fmt: skip
        self.queued = Gauge("dualpath_vllm_read_queue_blocks", "Blocks waiting in this node's read queue", registry=reg)  # fmt: skip
        reg.register(_ConnectorFiles(counters_files))
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="agent-reader", daemon=True)
        self.thread.start()

    def submit(self, job: _Job) -> None:
        self.queued.inc(len(job.hashes))
        self.jobs.put(job)

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                self._serve(job)
            except Exception:  # never kill the reader: the PE times out and recomputes
                log.exception("agent: read %s failed", job.key)
            self.queued.dec(len(job.hashes))

    def _serve(self, job: _Job) -> None:
        layout = self.store.layout
        nbytes, size = layout.layer_block_bytes, layout.block_size
        self.transport.add_route(job.endpoint, job.address)
        good = len(job.hashes)
        for layer in range(layout.num_layers):
            buf = np.empty((good, nbytes), dtype=np.uint8)
            for j in range(good):
                if not self.store.read_layer_into(job.hashes[j], layer, buf[j]):
                    self.misses.inc(good - j)
                    good = j
                    break
                self.de_read.inc(nbytes)
                if self.limiter is not None and job.capped:
                    wait_until(self.limiter.reserve(nbytes))
            item = TransferItem(key=job.key, block_index=0, layer=layer, num_tokens=good * size,
                                payload=buf[:good].reshape(-1))  # fmt: skip
            self.transport.submit(job.endpoint, [item]).wait(60.0)
            self.forwarded.inc(good * nbytes)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=5)
        self.transport.close()


def make_app(agent: Agent) -> FastAPI:
    app = FastAPI(title="dualpath vLLM agent")

    @app.post("/read")
    def read(req: ReadRequest) -> dict[str, Any]:
        if not req.hashes or not req.address.startswith(("tcp://", "ipc://")):
            raise HTTPException(422, f"bad read request: {len(req.hashes)} hashes, address {req.address!r}")
        agent.submit(_Job(key=req.key, hashes=tuple(req.hashes), address=req.address, endpoint=req.endpoint,
                         capped=req.capped))  # fmt: skip
        return {"queued": len(req.hashes), "node_id": agent.node_id}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(agent.registry), media_type="text/plain; version=0.0.4")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "node_id": agent.node_id}

    return app


def main(argv: list[str] | None = None) -> None:
    from dualpath.integrations.vllm.settings import snic_limiter

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="the HF folder vLLM serves (for the KV layout)")
    p.add_argument("--store-dir", required=True)
    p.add_argument("--block-size", type=int, default=32, help="the store block (tokens)")
    p.add_argument("--node-id", type=int, default=0)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--snic-gbps", type=float, default=None)
    p.add_argument("--snic-state-file", default=None)
    p.add_argument("--counters", action="append", default=[], help="connector counters files (globs)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    store = BlockStore(args.store_dir, model_layout(args.model, args.block_size), "auto")
    limiter = snic_limiter(args.snic_gbps, args.snic_state_file, "in")
    agent = Agent(store, node_id=args.node_id, limiter=limiter, counters_files=args.counters)
    uvicorn.run(make_app(agent), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
