"""The DE read path on the prefill side: hit KV forwarded layer by layer from a decode node's agent.

The prefill instance's connector (worker role) owns one :class:`ForwardInbox`: a ZeroMQ transport
endpoint (``runtime/transfer``) where agents deliver Layer Blocks. For a load whose read side is
"de" it asks the agent (``POST /read``, agent.py) to read the blocks from storage through its own
node's storage NIC and forward them; the agent sends, per layer, one span item holding that
layer's intact leading blocks (``num_tokens`` = blocks x store block size; fewer than asked when a
block failed to read: it and every later block are then a miss). :class:`StepLoads` puts one
step's local reads (PE read path, ``loadjob.LoadJob``) and forwarded ones behind LoadJob's
interface, so the connector's layerwise copy does not care which side read a block.
No vLLM import.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence

import httpx
import numpy as np

from dualpath.integrations.vllm.loadjob import LoadJob
from dualpath.integrations.vllm.plan import LoadSpec
from dualpath.runtime.kvstore import BandwidthLimiter, BlockStore
from dualpath.runtime.transfer import TransferItem
from dualpath.runtime.transfer.zmq_transport import ZmqTransport

log = logging.getLogger(__name__)


class _Forwarded:
    """One forwarded load: per layer, the intact leading blocks (set once the layer arrived)."""

    def __init__(self, key: str, num_layers: int, num_blocks: int) -> None:
        self.key = key
        self.num_blocks = num_blocks
        self.good = num_blocks
        self.bufs: list[np.ndarray | None] = [None] * num_layers
        self.ready = [threading.Event() for _ in range(num_layers)]
        self.error: str | None = None
        self.received_bytes = 0

    def fail(self, why: str) -> None:
        self.error, self.good = why, 0
        for event in self.ready:
            event.set()


class ForwardInbox:
    """The prefill worker's endpoint for forwarded Layer Blocks (a ``KVSink`` on a ZmqTransport)."""

    def __init__(self, store: BlockStore, *, host: str = "127.0.0.1", timeout_s: float = 120.0) -> None:
        self.layout = store.layout
        self.timeout_s = timeout_s
        self.transport = ZmqTransport(host=host)
        self.endpoint = f"dualpath-pe-{uuid.uuid4().hex[:8]}"
        self.transport.bind(self.endpoint, self)
        self._loads: dict[str, _Forwarded] = {}
        self._lock = threading.Lock()
        self._http = httpx.Client(timeout=10.0)

    @property
    def address(self) -> str:
        return self.transport.address

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        nbytes, size = self.layout.layer_block_bytes, self.layout.block_size
        for it in items:
            with self._lock:
                load = self._loads.get(it.key)
            if load is None or not 0 <= it.layer < len(load.bufs) or load.ready[it.layer].is_set():
                continue  # late (timed out) or unknown: dropped
            n = min(it.num_tokens // size, load.good)
            data = np.frombuffer(it.payload, dtype=np.uint8)
            if data.size < n * nbytes:
                n = data.size // nbytes
            load.bufs[it.layer] = data[: n * nbytes].reshape(n, nbytes).copy()
            load.good = n
            load.received_bytes += n * nbytes
            load.ready[it.layer].set()

    def request(self, agent_url: str, hashes: Sequence[str], *, capped: bool = True) -> _Forwarded:
        """Ask ``agent_url`` to read ``hashes`` layer by layer (through its node's storage NIC
        unless not ``capped``) and forward them here."""
        key = uuid.uuid4().hex
        load = _Forwarded(key, self.layout.num_layers, len(hashes))
        with self._lock:
            self._loads[key] = load
        body = {
            "key": key,
            "hashes": list(hashes),
            "address": self.address,
            "endpoint": self.endpoint,
            "capped": capped,
        }
        try:
            r = self._http.post(f"{agent_url.rstrip('/')}/read", json=body)
            r.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("DualPathConnector: agent %s refused a DE read (%s): a miss", agent_url, exc)
            load.fail(str(exc))
        return load

    def wait(self, load: _Forwarded, layer: int) -> np.ndarray:
        if not load.ready[layer].wait(self.timeout_s):
            load.fail(f"layer {layer} did not arrive within {self.timeout_s} s")
        buf = load.bufs[layer]
        return buf[: load.good] if buf is not None else np.empty((0, self.layout.layer_block_bytes), np.uint8)

    def done(self, load: _Forwarded) -> None:
        with self._lock:
            self._loads.pop(load.key, None)

    def close(self) -> None:
        self.transport.close()
        self._http.close()


class StepLoads:
    """One step's loads (``LoadSpec``s), each read here (no ``agent_url``: PE read path, through
    this node's storage NIC ``limiter`` when ``capped``) or forwarded by a decode node's agent (DE
    read path); LoadJob's interface."""

    def __init__(self, store: BlockStore, loads: Sequence[LoadSpec], *, inbox: ForwardInbox | None,
                 limiter: BandwidthLimiter | None = None) -> None:  # fmt: skip
        self.remote: dict[int, _Forwarded] = {}
        self.inbox = inbox
        for i, spec in enumerate(loads):
            if spec.agent_url:
                if inbox is None:
                    raise RuntimeError("a DE read needs the connector's forward inbox")
                self.remote[i] = inbox.request(spec.agent_url, spec.hashes, capped=spec.capped)
        # local reads: one job through the storage NIC, one uncapped (no-I/O baseline)
        self.local_idx = [i for i, s in enumerate(loads) if not s.agent_url and s.capped]
        self.free_idx = [i for i, s in enumerate(loads) if not s.agent_url and not s.capped]
        self.local = LoadJob(store, [loads[i].hashes for i in self.local_idx], limiter=limiter)
        self.free = LoadJob(store, [loads[i].hashes for i in self.free_idx]) if self.free_idx else None
        self.num_blocks = [len(s.hashes) for s in loads]

    def _locals(self) -> list[tuple[list[int], LoadJob]]:
        return [(self.local_idx, self.local)] + ([(self.free_idx, self.free)] if self.free else [])

    @property
    def read_bytes(self) -> int:
        """Bytes this node read from storage (the PE read path)."""
        return sum(job.read_bytes for _, job in self._locals())

    @property
    def forwarded_bytes(self) -> int:
        return sum(f.received_bytes for f in self.remote.values())

    @property
    def error(self) -> Exception | None:
        return self.local.error or (self.free.error if self.free else None)

    def wait(self, layer: int) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [None] * len(self.num_blocks)
        for idx, job in self._locals():
            for j, blocks in zip(idx, job.wait(layer), strict=True):
                out[j] = blocks
        for i, f in self.remote.items():
            assert self.inbox is not None
            out[i] = self.inbox.wait(f, layer)
        return [b for b in out if b is not None]

    def release(self, layer: int) -> None:
        for _, job in self._locals():
            job.release(layer)
        for f in self.remote.values():
            f.bufs[layer] = None

    def finish(self) -> list[int]:
        good = [0] * len(self.num_blocks)
        for idx, job in self._locals():
            for j, g in zip(idx, job.finish(), strict=True):
                good[j] = g
        for i, f in self.remote.items():
            assert self.inbox is not None
            for layer in range(len(f.ready)):
                self.inbox.wait(f, layer)
            good[i] = f.good
            if f.error:
                log.warning("DualPathConnector: a DE read failed (%s): those blocks are a miss", f.error)
            self.inbox.done(f)
        return good
