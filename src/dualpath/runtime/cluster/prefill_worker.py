"""Prefill engine worker: the cluster's adapter around ``runtime/engine``'s ``PrefillEngine``.

The engine prefills layer by layer with one layer's cached KV staged at a time, the next layer's
load overlapped on its loader thread, and streams every layer's new KV (and PE-path hit KV) to the
request's DE. This worker admits ``PrefillTask`` s, plans batches with the policy
(``plan_prefill_batch`` over the engine's ready requests), sends the first token to the DE
(``PrefillDone``) and, as soon as the step returns, to the scheduler (``Progress``
"prefill_done" with ``first_token``: streamed to the client while the DE starts decoding), and
reports progress. The task's ``ReadPlan`` (the policy's read side) goes to the
engine as it is. Control messages to and from the DE are ``runtime/transfer/control.py``'s. Read
paths:

- "pe": the engine's hit reads go through ``pe_remote.PeIO`` (this node's SNIC, ``pe-read``) into
  the PE buffer.
- "de": the DE reads the hits into its buffer and announces them (``HitsLoaded``); for each layer
  the engine pulls that layer's cached KV (``PullLayer`` to the DE, Layer Blocks back into the
  staging slot), so the PE never holds more than two layers of it.
- "split": the PE reads its share as on "pe"; the DE pushes its share into the PE buffer layer by
  layer (``pe_remote.RemoteDE.pushed_share``); those blocks count as read once all their layers
  arrived, and a ``HitsLoaded`` cuts the share short when the DE missed a block.

Thread model: ``deliver`` / ``control`` run on the transport's receive thread, reads complete on
the I/O thread, pulls are awaited on the engine's loader thread; they share ``_lock``. ``step`` /
``add`` / ``cancel`` run on the engine's main thread (the only one calling the engine, but for
deliveries).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from dualpath.core.errors import ConfigError
from dualpath.policy import Scheduler
from dualpath.policy import views as pv
from dualpath.policy.batch import BatchLimits
from dualpath.runtime.cluster.kvio import BlockIO, Geometry, Outbox
from dualpath.runtime.cluster.memory import KVPools
from dualpath.runtime.cluster.messages import PrefillTask, Progress
from dualpath.runtime.cluster.pe_remote import PeIO, RemoteDE, Split, when_all
from dualpath.runtime.cluster.worker_base import WorkerBase
from dualpath.runtime.engine import PrefillConfig, PrefillEngine, PrefillRequest
from dualpath.runtime.kvstore import chain_hashes
from dualpath.runtime.model import Decoder
from dualpath.runtime.transfer.base import TransferError, TransferItem, Transport
from dualpath.runtime.transfer.control import Control, HitsLoaded, PrefillDone

TRANSFER_TIMEOUT_S = 3.0  # a DE that does not answer within this is presumed dead: retry the batch

__all__ = ["PrefillWorker"]


class PrefillWorker(WorkerBase):
    def __init__(
        self,
        *,
        engine_id: int,
        node_id: int,
        decoder: Decoder,
        geo: Geometry,
        blockio: BlockIO,
        transport: Transport,
        scheduler: Scheduler,
        outbox: Outbox,
        pools: KVPools,
    ) -> None:
        """``pools``: the PE buffer and staging sizes (``memory.size_pools``)."""
        super().__init__()
        self.engine_id, self.node_id = engine_id, node_id
        self.geo, self.io, self.transport = geo, blockio, transport
        self.scheduler, self.outbox = scheduler, outbox
        self.engine = PrefillEngine(
            decoder,
            transport,
            PeIO(self),
            PrefillConfig(  # type: ignore[arg-type]
                name=f"e{engine_id}.staging",
                block_size=geo.block_size,
                buffer_bytes=pools.buffer_blocks * pools.block_bytes,
                max_cached_tokens=pools.staging_tokens,
                overlap=True,
                transfer_timeout_s=TRANSFER_TIMEOUT_S,
            ),
        )
        self._cond = threading.Condition(self._lock)
        self._pulling: set[str] = set()  # admitted "de" requests (layers pulled per step)
        self._split: dict[str, Split] = {}  # admitted split requests: DE share pushed to the buffer
        self._hits: dict[str, int] = {}  # HitsLoaded.end_tokens of "de" (and early "split") requests
        self._arrived: dict[tuple[str, int], int] = {}  # pulled tokens per (request, layer)
        self._connected: set[str] = set()  # DE endpoints registered with the engine
        self._solo: set[str] = set()  # requests of a failed batch: each runs alone next
        # the room this engine reports to the batch planner: one staging slot per layer's batch
        self.limits = BatchLimits(staging_tokens=pools.staging_tokens, block_size=geo.block_size)

    # ------------------------------------------------------------------ load / admin
    def _task_tokens(self, task: PrefillTask) -> int:
        return len(task.prompt_token_ids)

    def _admit_one(self, task: PrefillTask) -> bool:
        bs, rid, de, read = self.geo.block_size, task.request_id, f"e{task.decode_engine}", task.read
        hashes = tuple(chain_hashes(task.prompt_token_ids[: read.hit_len], bs))
        early = self._hits.get(rid)  # a HitsLoaded that came before the task
        if early is not None and early > read.hit_len:
            raise ValueError(f"{rid}: DE-path hits announced to end at {early}, the task has {read.hit_len}")
        if read.side != "pe" and de not in self._connected:
            self.engine.connect(de, RemoteDE(self, task.decode_engine))  # type: ignore[arg-type]
            self._connected.add(de)
        req = PrefillRequest(
            request_id=rid,
            token_ids=tuple(task.prompt_token_ids),
            decode_endpoint=de,
            read_side=read.side,
            hit_hashes=hashes,
            sampling=task.params,
            split_block=read.pe_read_len // bs if read.side == "split" else 0,
            first_step=task.num_generated,
        )
        if not self.engine.add_request(req):
            return False
        if read.pe_read_len:  # the PE's share read from the store: tell the scheduler at once
            when_all(self.engine.hit_reads(rid)[: read.pe_read_len // bs], lambda: self._read_done(rid))
        with self._lock:
            if read.side == "de":
                self._pulling.add(rid)
            self._deliver_locked([x for x in self._orphans.take(rid) if isinstance(x, TransferItem)])
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
    def control(self, source: str, msgs: Sequence[Control]) -> None:
        """DE -> PE: ``HitsLoaded`` ("de": the hits are in the DE buffer; "split": its share is cut)."""
        with self._lock:
            for m in msgs:
                if not isinstance(m, HitsLoaded):  # (refused in the sender's ack)
                    raise ValueError(f"{m.key}: a prefill engine takes no {type(m).__name__}")
                task = self._tasks.get(m.key)
                if task is not None and m.end_tokens > task.read.hit_len:
                    raise ValueError(
                        f"{m.key}: DE-path hits announced to end at {m.end_tokens}, the "
                        f"task has {task.read.hit_len}"
                    )
                if m.key in self._split:
                    self._split[m.key].cut(m.end_tokens // self.geo.block_size)
                else:
                    self._hits[m.key] = m.end_tokens

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        """DE -> PE: pulled Layer Blocks (into staging), pushed split shares (into the buffer)."""
        with self._lock:
            self._deliver_locked(items)

    def _deliver_locked(self, items: Sequence[TransferItem]) -> None:
        for it in items:
            rid = it.key
            if rid in self._pulling:
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
            entries = self._isolate(list(self.scheduler.plan_prefill_batch(view, self.limits).entries))
        except Exception as exc:  # noqa: BLE001 - the plan over these requests failed: fail them
            for i, item in enumerate(ready):
                self.fail_task(
                    item.request_id,
                    "its batch could not be planned (see the engine log)",
                    exc if i == 0 else None,
                )
            return True
        if not entries:
            return False
        try:
            outs = self.engine.step(entries)
        except TransferError as exc:  # a DE died or stalls: redo these requests (the scheduler
            # cancels the ones of a dead DE meanwhile)
            msg = f"KV hand-off failed ({exc}); prefilling {len(entries)} request(s) again"
            print(f"engine {self.engine_id}: {msg}", flush=True)
            for e in entries:
                self._retry(e.request_id)
            self._admit_waiting()  # (back into the engine now: nothing else may come to admit them)
            return True
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the engine
            self._step_failed(entries, exc)
            return True
        for out in outs:
            task = self._tasks.get(out.request_id)
            self._forget(out.request_id)
            if task is None:
                continue
            done = PrefillDone(key=out.request_id, first_token=out.first_token)
            self.transport.notify(f"e{task.decode_engine}", [done], source=f"e{self.engine_id}")
            self.outbox.put(  # sent as soon as this step returns: the first token goes to the client
                Progress(
                    request_id=out.request_id,
                    engine_id=self.engine_id,
                    event="prefill_done",
                    hit_len=out.hit_tokens,
                    first_token=out.first_token,
                )
            )
        self._admit_waiting()
        return True

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
        self._admit_waiting()

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
