"""The worker side of the connector's loads: store hits into vLLM's paged cache (torch; no vLLM).

Two ways, per request (``LoadSpec.async_load``, from the connector's ``load`` setting):

- **layerwise** (sync): the step's loads start before the forward (``start``); the layer ``i``
  copy waits for that layer's bytes just before layer ``i`` runs (``wait_layer``), so reads of
  later layers overlap the compute of earlier ones; the request runs in this very step.
- **async**: the request waits unscheduled (vLLM's WAITING_FOR_REMOTE_KVS) while a thread reads and
  copies every layer; ``finished()`` reports it done and vLLM schedules it in a later step. Other
  requests keep running meanwhile. Each request's load is its own job, so it is reported done as
  soon as its own blocks are in (not when the slowest load admitted in the same step is): DE loads
  (forwarded by a decode node's agent, whose read queue is FIFO) and uncapped ones each run in
  their own thread; capped PE loads share this node's storage NIC and run one after another in
  arrival order on one thread (the PE lane), so the first is in after its own bytes, not after
  everyone's, and its compute overlaps the reads of the next (fair sharing would finish them all
  at the end). A split load (the PE reads the prefix, a decode node's agent the rest) is two jobs,
  its PE part in the PE lane and its DE part in its own thread, both reading at once; the request
  is done when both are (a split's PE part outside the lane would share the NIC with every other
  PE read and finish with them at the end).

A block that fails to read ends its request's good prefix; the vLLM blocks from there on are
reported by ``errors()`` (recomputed with ``kv_load_failure_policy`` "recompute"). Counters:
``read_bytes`` (PE read path: read from storage here), ``forwarded_in_bytes`` (DE read path).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence

import torch

from dualpath.integrations.vllm.forward import ForwardInbox, StepLoads
from dualpath.integrations.vllm.kvcopy import PagedLayer
from dualpath.integrations.vllm.plan import BlockSizes, LoadSpec
from dualpath.runtime.kvstore import BandwidthLimiter, BlockStore

log = logging.getLogger(__name__)


class HitLoader:
    """Loads of one worker; ``layers[i]`` is layer ``i``'s paged cache."""

    def __init__(self, store: BlockStore, sizes: BlockSizes, *, num_kv_heads: int, head_dim: int,
                 limiter: BandwidthLimiter | None, on_done: Callable[[], None]) -> None:  # fmt: skip
        self.store, self.sizes, self.limiter, self.on_done = store, sizes, limiter, on_done
        self.kv_heads, self.head_dim = num_kv_heads, head_dim
        self.layers: dict[int, PagedLayer] = {}
        self.inbox: ForwardInbox | None = None
        self._lock = threading.Lock()
        self._errors: set[int] = set()
        self._done: set[str] = set()
        self._in_flight = 0  # async load threads running
        self._finished_event = threading.Event()
        self._job: StepLoads | None = None
        self._loads: list[LoadSpec] = []
        self._pe_lane: queue.SimpleQueue[LoadSpec | None] | None = None
        self.counters = {"loaded_blocks": 0, "failed_blocks": 0, "read_bytes": 0, "forwarded_in_bytes": 0}

    def _new_job(self, loads: Sequence[LoadSpec]) -> StepLoads:
        with self._lock:  # (async load threads start jobs too)
            if self.inbox is None and any(s.agent_url for s in loads):
                self.inbox = ForwardInbox(self.store)  # the DE read path's endpoint, on first use
        return StepLoads(self.store, loads, inbox=self.inbox, limiter=self.limiter)

    def start(self, loads: Sequence[LoadSpec]) -> None:
        """Start this step's loads: each async one as its own job (capped PE ones queued on the PE
        lane, the rest in their own thread), the others layerwise in this step. A split load is
        two parts (``LoadSpec.parts``): layerwise, two loads of this step's job; async, two jobs
        (its PE part on the PE lane, its DE part in its own thread), done when both are."""
        size = self.sizes.store_block_size
        now = [p for s in loads if not s.async_load for p in s.parts(size)]
        self._job, self._loads = (self._new_job(now), now) if now else (None, [])
        for spec in (s for s in loads if s.async_load):
            parts = spec.parts(size)
            left = [len(parts)]  # parts of this request not yet in (shared by its jobs, under the lock)
            with self._lock:
                self._in_flight += 1
            for part in parts:
                if part.capped and not part.agent_url:
                    if self._pe_lane is None:
                        self._pe_lane = queue.SimpleQueue()
                        threading.Thread(target=self._run_pe_lane, args=(self._pe_lane,), name="dualpath-kv-pe",
                                         daemon=True).start()  # fmt: skip
                    self._pe_lane.put((part, left))
                else:
                    threading.Thread(target=self._run_async, args=(part, left), name="dualpath-kv-async",
                                     daemon=True).start()  # fmt: skip

    def _run_pe_lane(self, lane: queue.SimpleQueue[tuple[LoadSpec, list[int]] | None]) -> None:
        while (job := lane.get()) is not None:
            self._run_async(*job)

    def _copy_layer(self, job: StepLoads, loads: Sequence[LoadSpec], layer: int) -> None:
        paged = self.layers.get(layer)
        size, ratio, vb = self.sizes.store_block_size, self.sizes.ratio, self.sizes.vllm_block_size
        for spec, blocks in zip(loads, job.wait(layer), strict=True):
            if len(blocks) and paged is not None:
                tokens = (torch.from_numpy(blocks).view(paged.cache.dtype)
                          .view(len(blocks) * size, 2, self.kv_heads, self.head_dim))  # fmt: skip
                lo = spec.start_token - spec.first_block * size  # vLLM-block aligned
                hi = min(spec.end_token - spec.first_block * size, len(blocks) * size)
                if hi > lo:
                    first = spec.first_block * ratio + lo // vb
                    paged.scatter(spec.vllm_block_ids[first : first + (hi - lo) // vb], tokens[lo:hi])
        job.release(layer)

    def _account(self, job: StepLoads, loads: Sequence[LoadSpec]) -> set[int]:
        good = job.finish()
        bad: set[int] = set()
        with self._lock:
            self.counters["read_bytes"] += job.read_bytes
            self.counters["forwarded_in_bytes"] += job.forwarded_bytes
        if job.error is not None:
            log.error("DualPathConnector: store reads failed (%s); those hits are recomputed", job.error)
        vb, size = self.sizes.vllm_block_size, self.sizes.store_block_size
        for spec, n_good, n in zip(loads, good, job.num_blocks, strict=True):
            with self._lock:
                self.counters["loaded_blocks"] += n_good
                self.counters["failed_blocks"] += n - n_good
            if n_good < n:  # recompute from the first unreadable block on
                bad_from = max(spec.start_token, (spec.first_block + n_good) * size)
                bad.update(spec.vllm_block_ids[bad_from // vb : -(-spec.end_token // vb)])
                log.warning("DualPathConnector: request %s: %d of %d store blocks unreadable, "
                            "recomputing tokens from %d", spec.req_id, n - n_good, n, bad_from)  # fmt: skip
        return bad

    def _run_async(self, spec: LoadSpec, left: list[int]) -> None:
        """One async load (a request's whole load, or one part of a split), in this thread; the
        request is reported done when ``left`` (its parts still loading) reaches 0."""
        bad: set[int] = set()
        loads = [spec]
        try:
            job = self._new_job(loads)  # its reads start now (on the PE lane: after the previous load)
            for layer in range(self.store.layout.num_layers):
                self._copy_layer(job, loads, layer)
            bad = self._account(job, loads)
        except Exception:  # a failed load is a miss of every block, never a hung request
            log.exception("DualPathConnector: async load failed; recomputing those requests")
            bad = {b for s in loads for b in s.vllm_block_ids[s.start_token // self.sizes.vllm_block_size :
                                                               -(-s.end_token // self.sizes.vllm_block_size)]}  # fmt: skip
        with self._lock:  # errors no later than the pass that reports the request done
            self._errors.update(bad)
            left[0] -= 1
            if not left[0]:
                self._done.add(spec.req_id)
                self._in_flight -= 1
                self._finished_event.set()
        self.on_done()

    def wait_layer(self, layer: int) -> None:
        """Layerwise loads: copy ``layer`` in (waiting for its bytes); after the last, account."""
        job = self._job
        if job is None:
            return
        self._copy_layer(job, self._loads, layer)
        if layer == self.store.layout.num_layers - 1:
            self._finish_sync()

    def _finish_sync(self) -> None:
        assert self._job is not None
        bad = self._account(self._job, self._loads)
        with self._lock:
            self._errors.update(bad)
        self._job, self._loads = None, []
        self.on_done()

    def finished(self, idle_wait_s: float = 0.0) -> set[str]:
        """Async loads done since the last call (their requests may be scheduled). With
        ``idle_wait_s`` (a step that ran no forward while loads are in flight) wait that long for
        one to finish: vLLM steps again at once when every request waits for its KV, and a busy
        loop would take a CPU core from the other instances for as long as the reads last."""
        with self._lock:
            waiting = not self._done and self._in_flight > 0
        if waiting and idle_wait_s > 0:
            self._finished_event.wait(idle_wait_s)
        with self._lock:
            out, self._done = self._done, set()
            self._finished_event.clear()
        return out

    def errors(self) -> set[int]:
        """vLLM block ids whose load failed since the last call (a step whose last layer never
        waited, with no attention metadata, is finished here)."""
        if self._job is not None:
            self._finish_sync()
        with self._lock:
            out, self._errors = self._errors, set()
        return out

    def close(self) -> None:
        if self._pe_lane is not None:
            self._pe_lane.put(None)
        if self.inbox is not None:
            self.inbox.close()
