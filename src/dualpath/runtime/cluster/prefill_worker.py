"""Prefill engine worker: the cluster's adapter around ``runtime/engine``'s ``PrefillEngine``.

The engine prefills layer by layer with one layer's cached KV staged at a time, the next layer's
load overlapped on its loader thread, and streams every layer's new KV (and PE-path hit KV) to the
request's DE. This worker admits ``PrefillTask`` s, plans batches with the policy
(``plan_prefill_batch`` over the engine's ready requests), sends the first token to the DE as a
``DONE_LAYER`` marker and reports progress. Read paths:

- PE read path: the engine's hit reads go through ``_PeIO`` (this node's SNIC, ``pe-read``) into the
  PE buffer.
- DE read path: the DE reads the hits into its buffer and announces them (``READY_LAYER`` marker);
  for each layer the engine pulls that layer's cached KV (``PULL_LAYER`` marker to the DE, Layer
  Blocks back into the staging slot), so the PE never holds more than two layers of it.
- Split (both): the DE pushes its share into the PE buffer layer by layer; those blocks count as
  read once all their layers arrived.

Thread model: ``deliver`` runs on the transport's receive thread, reads complete on the I/O thread,
pulls are awaited on the engine's loader thread; they share ``_lock``. ``step`` / ``add`` /
``cancel`` run on the engine's main thread (the only one calling the engine, but for deliveries).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from dualpath.core.errors import ConfigError
from dualpath.core.units import GiB
from dualpath.policy import Scheduler
from dualpath.policy import views as pv
from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.kvio import (
    DONE_LAYER, PULL_LAYER, READY_LAYER, BlockIO, Geometry, Outbox,
)  # fmt: skip
from dualpath.runtime.cluster.messages import PrefillTask, Progress
from dualpath.runtime.cluster.worker_base import WorkerBase
from dualpath.runtime.engine import PrefillConfig, PrefillEngine, PrefillRequest
from dualpath.runtime.kvstore import ReadResult, chain_hashes
from dualpath.runtime.model import Decoder
from dualpath.runtime.transfer.base import TransferError, TransferItem, Transport

TRANSFER_TIMEOUT_S = 3.0  # a DE that does not answer within this is presumed dead: retry the batch
MAX_BUFFER_BYTES = 1 * GiB  # PE buffer (PE-path prompts); requests beyond wait for room
STAGING_TOKENS = 65536  # one layer's batch (cached + new, block-padded) per staging slot

__all__ = ["PrefillWorker"]


class PrefillWorker(WorkerBase):
    def __init__(self, *, engine_id: int, node_id: int, decoder: Decoder, geo: Geometry,
                 blockio: BlockIO, transport: Transport, scheduler: Scheduler, outbox: Outbox) -> None:
        super().__init__()
        self.engine_id, self.node_id = engine_id, node_id
        self.geo, self.io, self.transport = geo, blockio, transport
        self.scheduler, self.outbox = scheduler, outbox
        bb = geo.layout().full_block_bytes
        self._pe_io = _PeIO(self)
        self.engine = PrefillEngine(decoder, transport, self._pe_io, PrefillConfig(  # type: ignore[arg-type]
            name=f"e{engine_id}.staging", block_size=geo.block_size,
            buffer_bytes=max(min(MAX_BUFFER_BYTES, 1024 * bb), bb), max_cached_tokens=STAGING_TOKENS,
            overlap=True, transfer_timeout_s=TRANSFER_TIMEOUT_S))
        self._cond = threading.Condition(self._lock)
        self._pulling: set[str] = set()  # admitted DE-read-path requests (layers pulled per step)
        self._split: dict[str, _Split] = {}  # admitted split requests: DE share pushed to the buffer
        self._hits: dict[str, int] = {}  # DE-path hit tokens announced by the DEs
        self._arrived: dict[tuple[str, int], int] = {}  # pulled tokens per (request, layer)
        self._connected: set[str] = set()  # DE endpoints registered with the engine
        self._solo: set[str] = set()  # requests of a failed batch: each runs alone next

    # ------------------------------------------------------------------ load / admin
    def _task_tokens(self, task: PrefillTask) -> int:
        return len(task.prompt_token_ids)

    def _admit_one(self, task: PrefillTask) -> bool:
        bs, rid, de = self.geo.block_size, task.request_id, f"e{task.decode_engine}"
        hashes = tuple(chain_hashes(task.prompt_token_ids[:task.hit_len], bs))
        pure_de = task.de_read_len > 0 and task.pe_read_len == 0
        early = self._hits.get(rid)  # a READY marker that came before the task
        if early is not None and early > task.hit_len:
            raise ValueError(f"{rid}: {early} DE-path hit tokens announced, the task has {task.hit_len}")
        if pure_de and de not in self._connected:
            self.engine.connect(de, _RemoteDE(self, task.decode_engine))  # type: ignore[arg-type]
            self._connected.add(de)
        req = PrefillRequest(request_id=rid, token_ids=tuple(task.prompt_token_ids), decode_endpoint=de,
                             read_side="de" if pure_de else "pe", hit_hashes=hashes,
                             sampling=task.params)  # fmt: skip
        self._pe_io.expect(rid, task.pe_read_len // bs, task.de_read_len // bs if not pure_de else 0)
        if not self.engine.add_request(req):
            self._pe_io.expect(None, 0, 0)
            return False
        with self._lock:
            if pure_de:
                self._pulling.add(rid)
            self._deliver_locked(self._orphans.take(rid))
        return True

    def _read_done(self, rid: str) -> None:
        self.outbox.put_express(Progress(request_id=rid, engine_id=self.engine_id, event="read_done"))

    def cancel(self, rid: str) -> None:
        """Forget the task; the engine drops the request once it is ready (its reads done), so the
        main thread never blocks on a read."""
        with self._lock:
            self._tasks.pop(rid, None)
            self._orphans.discard(rid)
            if rid in self._pulling:
                self._hits.setdefault(rid, 0)  # (its DE may never announce its hits now)
            split = self._split.pop(rid, None)
        if split is not None:
            split.resolve(ok=False)

    def _release_failed(self, rid: str) -> None:
        """A failed request: drop it from the engine now (waits for its reads) and forget it."""
        self.engine.abort(rid)
        self._forget(rid)

    def _forget(self, rid: str) -> None:
        self._solo.discard(rid)
        with self._lock:
            self._tasks.pop(rid, None)
            self._pulling.discard(rid)
            self._hits.pop(rid, None)
            sp = self._split.pop(rid, None)
        if sp is not None:
            sp.resolve(ok=False)

    # ------------------------------------------------------------------ transport sink
    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        """DE -> PE: READY markers, pulled Layer Blocks (into staging), pushed split shares."""
        with self._lock:
            self._deliver_locked(items)

    def _deliver_locked(self, items: Sequence[TransferItem]) -> None:
        for it in items:
            rid = it.key
            if it.layer == READY_LAYER:  # DE path: hits announced; split: the DE share is cut
                end = int(np.frombuffer(it.payload, dtype=np.int64)[0])  # type: ignore[arg-type]
                task = self._tasks.get(rid)
                if end < 0 or (task is not None and end > task.hit_len):  # (refused in the sender's ack)
                    raise ValueError(f"{rid}: DE-path hits announced to end at {end}, the task has "
                                     f"{task.hit_len if task else '?'}")
                if rid in self._split:
                    self._split[rid].cut(end // self.geo.block_size)
                else:
                    self._hits[rid] = end
            elif rid in self._pulling:
                try:
                    self.engine.staging.deliver("", [it])
                except ConfigError:  # a stale pull of an aborted batch
                    continue
                key = (rid, it.layer)
                self._arrived[key] = self._arrived.get(key, 0) + it.num_tokens
                self._cond.notify_all()
            elif rid in self._split:
                self.engine.buffer.deliver("", [it])
                self._split[rid].arrived(it.num_tokens)
            else:  # before its task (or after it ended: purged after worker_base.ORPHAN_TTL_S)
                self._orphans.hold(it)

    # ------------------------------------------------------------------ compute
    def has_work(self) -> bool:
        return bool(self._ready())

    def _ready(self) -> list[pv.BatchItem]:
        items = []
        for item in self.engine.waiting():
            if item.request_id in self._tasks:
                items.append(item)
            else:  # cancelled; its reads are done now, so dropping it does not block
                self.engine.abort(item.request_id)
                self._forget(item.request_id)
        return items

    def step(self) -> bool:
        """Run one planned batch if any request is ready; returns whether it did anything."""
        self._admit_waiting()
        ready = self._ready()
        if not ready:
            return False
        view = pv.BatchView(now_s=time.monotonic(), engine_id=self.engine_id, waiting=tuple(ready))
        try:
            entries = self._isolate(self._fit(self.scheduler.plan_prefill_batch(view).entries))
        except Exception as exc:  # noqa: BLE001 - the plan over these requests failed: fail them
            for i, item in enumerate(ready):
                self.fail_task(item.request_id, "its batch could not be planned (see the engine log)",
                               exc if i == 0 else None)
            return True
        if not entries:
            return False
        try:
            outs = self.engine.step(entries)
        except TransferError:  # a DE died or stalls: redo these requests (the scheduler cancels
            for e in entries:  # the ones of a dead DE meanwhile)
                self._retry(e.request_id)
            return True
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the engine
            self._step_failed(entries, exc)
            return True
        for out in outs:
            task = self._tasks.get(out.request_id)
            self._forget(out.request_id)
            if task is None:
                continue
            marker = TransferItem(key=out.request_id, block_index=-1, layer=DONE_LAYER, num_tokens=1,
                                  payload=np.array([out.first_token], dtype=np.int64).tobytes())
            self.transport.submit(f"e{task.decode_engine}", [marker], source=f"e{self.engine_id}")
            self.outbox.put(Progress(request_id=out.request_id, engine_id=self.engine_id,
                                     event="prefill_done", hit_len=out.hit_tokens))
        self._admit_waiting()
        return True

    def _fit(self, entries: Sequence[pv.BatchEntry]) -> list[pv.BatchEntry]:
        """The plan's leading entries whose staging rows (cached + chunk, block-padded) fit a slot."""
        out: list[pv.BatchEntry] = []
        used = 0
        for e in entries:
            used += self.geo.block_size * -(-(e.cached_len + e.chunk_len) // self.geo.block_size)
            if out and used > STAGING_TOKENS:
                break
            out.append(e)
        return out

    def _isolate(self, entries: list[pv.BatchEntry]) -> list[pv.BatchEntry]:
        """A request that was in a failed batch runs alone (so a second failure is its own)."""
        for e in entries:
            if e.request_id in self._solo:
                return [e]
        return entries

    def _step_failed(self, entries: Sequence[pv.BatchEntry], exc: Exception) -> None:
        """A batch raised: alone, the request fails; in company, each is retried alone. First the
        next layer's load the failed step left on the engine's loader thread must finish, so it
        cannot write into a staging slot the next batch uses."""
        loader = getattr(self.engine, "_loader", None)  # (the engine's single loader thread)
        if loader is not None:
            loader.submit(lambda: None).result(timeout=10 * TRANSFER_TIMEOUT_S)
        if len(entries) == 1:
            self.fail_task(entries[0].request_id, "prefill failed (see the engine log)", exc)
            return
        for e in entries:
            self._solo.add(e.request_id)
            self._retry(e.request_id)

    def _retry(self, rid: str) -> None:
        self.engine.abort(rid)
        with self._lock:
            split = self._split.pop(rid, None)
            self._pulling.discard(rid)
        if split is not None:  # its DE share was pushed once: cannot be redone here
            split.resolve(ok=False)
            self._forget(rid)
            self.outbox.put(Progress(request_id=rid, engine_id=self.engine_id, event="failed",
                                     error=f"prefill engine {self.engine_id}: KV transfer to its "
                                           f"decode engine failed"))  # fmt: skip
            return
        self._waiting.insert(0, rid)


class _Split:
    """The DE share of a split request: block futures resolved when all its layers arrived."""

    __slots__ = ("futures", "hashes", "left", "first_block", "block_tokens")

    def __init__(self, hashes: Sequence[str], futures: list[Future[ReadResult]], first_block: int,
                 block_tokens: int) -> None:
        self.hashes, self.futures, self.left = list(hashes), futures, len(hashes) * block_tokens
        self.first_block, self.block_tokens = first_block, block_tokens

    def cut(self, end_block: int) -> None:
        """The DE read its share only up to block ``end_block`` (a miss ended it): the blocks
        after fail (the engine recomputes from there), the rest resolve when they arrived."""
        keep = max(0, min(end_block - self.first_block, len(self.futures)))
        for h, f in zip(self.hashes[keep:], self.futures[keep:], strict=True):
            if not f.done():
                f.set_result(ReadResult(block_hash=h, layer=None, ok=False, data=None))
                self.left -= self.block_tokens
        if self.left <= 0:
            self.resolve(ok=True)

    def arrived(self, num_tokens: int) -> None:
        self.left -= num_tokens
        if self.left <= 0:
            self.resolve(ok=True)

    def resolve(self, *, ok: bool) -> None:
        for h, f in zip(self.hashes, self.futures, strict=True):
            if not f.done():
                f.set_result(ReadResult(block_hash=h, layer=None, ok=ok, data=None))


class _PeIO:
    """The engine's ``IOEngine`` on a PE: PE-path blocks read through this node's SNIC; a split
    request's trailing DE-share blocks are "read" when the DE has pushed them (``_Split``)."""

    def __init__(self, worker: PrefillWorker) -> None:
        self.w = worker
        self._next: tuple[str | None, int, int] = (None, 0, 0)

    def expect(self, rid: str | None, pe_blocks: int, de_blocks: int) -> None:
        """The next ``submit_blocks`` is request ``rid``'s: its first ``pe_blocks`` from the store,
        the next ``de_blocks`` from the DE."""
        self._next = (rid, pe_blocks, de_blocks)

    def submit_blocks(self, hashes: list[str], outs: list[np.ndarray]) -> list[Future[ReadResult]]:
        rid, pe_blocks, de_blocks = self._next
        assert rid is not None and pe_blocks + de_blocks >= len(hashes) > 0
        pe_blocks = min(pe_blocks, len(hashes))
        local: list[Future[ReadResult]] = [Future() for _ in range(pe_blocks)]
        if pe_blocks:
            def done(num_read: int, err: BaseException | None) -> None:
                ok_upto = num_read if err is None else 0  # a miss ends the loaded prefix
                for i, (h, out, f) in enumerate(zip(hashes, outs, local, strict=False)):
                    f.set_result(ReadResult(block_hash=h, layer=None, ok=i < ok_upto, data=out))
                self.w._read_done(rid)

            self.w.io.read_into(hashes[:pe_blocks], outs[:pe_blocks], "pe-read", done)
        remote: list[Future[ReadResult]] = [Future() for _ in range(len(hashes) - pe_blocks)]
        if remote:
            geo = self.w.geo
            sp = _Split(hashes[pe_blocks:], remote, pe_blocks, geo.block_size * geo.num_layers)
            with self.w._lock:
                self.w._split[rid] = sp
                end = self.w._hits.pop(rid, None)  # the DE's cut came first
                if end is not None:
                    sp.cut(end // self.w.geo.block_size)
        return local + remote


class _RemoteDE:
    """``RemoteKV`` of one DE across processes: hits announced by its READY marker; a layer is
    pulled with a PULL marker and arrives as Layer Blocks in the staging slot (``deliver``)."""

    def __init__(self, worker: PrefillWorker, de_id: int) -> None:
        self.w, self.de_id = worker, de_id

    def loaded_hit_tokens(self, request_id: str) -> int | None:
        with self.w._lock:
            return self.w._hits.get(request_id)

    def request_layer(self, request_id: str, layer: int, start: int, stop: int, dest: str) -> _Pull:
        with self.w._lock:
            self.w._arrived[(request_id, layer)] = 0
        ask = TransferItem(key=request_id, block_index=-1, layer=PULL_LAYER, num_tokens=1,
                           payload=np.array([layer, start, stop], dtype=np.int64).tobytes())
        self.w.transport.submit(f"e{self.de_id}", [ask], source=f"e{self.w.engine_id}")
        return _Pull(self.w, request_id, layer, stop - start, self.de_id)


class _Pull:
    """Handle of one pulled layer: done when ``num_tokens`` tokens of it are in the staging slot."""

    def __init__(self, w: PrefillWorker, rid: str, layer: int, num_tokens: int, de_id: int) -> None:
        self.w, self.key, self.num_tokens, self.de_id = w, (rid, layer), num_tokens, de_id

    def wait(self, timeout_s: float | None = None) -> None:
        end = time.monotonic() + (timeout_s if timeout_s is not None else 1e9)
        with self.w._cond:
            while self.w._arrived.get(self.key, 0) < self.num_tokens:
                left = end - time.monotonic()
                if left <= 0 or not self.w._cond.wait(left):
                    if self.w._arrived.get(self.key, 0) < self.num_tokens:
                        raise TransferError(f"layer {self.key[1]} of {self.key[0]} from decode "
                                            f"engine {self.de_id} did not arrive")  # fmt: skip
            self.w._arrived.pop(self.key, None)

