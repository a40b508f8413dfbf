"""Prefill engine worker: gathers each request's hit KV (PE read path: from the store through this
node's SNIC; DE read path: Layer Blocks from its DE over the transport), then prefills layer by layer
in batches planned by the policy (``plan_prefill_batch``), streaming every layer's prompt KV to the
request's DE and finally the first token (a DONE_LAYER marker).

Thread model: ``deliver`` runs on the transport's receive thread and reads complete on the I/O thread;
both only touch request state under ``_lock``. ``step`` runs on the engine's main thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dualpath.policy import Scheduler
from dualpath.runtime.cluster.batching import PrefillQueue
from dualpath.runtime.cluster.kvio import DONE_LAYER, BlockIO, Geometry, Outbox, sample
from dualpath.runtime.cluster.messages import PrefillTask, Progress
from dualpath.runtime.model import Decoder, Span
from dualpath.runtime.transfer.base import TransferItem, Transport


@dataclass(slots=True)
class _Req:
    task: PrefillTask
    kv: torch.Tensor
    dest: str
    pe_ready: bool
    de_layers_left: int
    sent_hit: bool = False
    failed: str | None = None
    handles: list[object] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.pe_ready and self.de_layers_left == 0 and self.failed is None


class PrefillWorker:
    def __init__(self, *, engine_id: int, node_id: int, decoder: Decoder, geo: Geometry,
                 blockio: BlockIO, transport: Transport, scheduler: Scheduler, outbox: Outbox) -> None:
        self.engine_id, self.node_id = engine_id, node_id
        self.decoder, self.geo, self.io = decoder, geo, blockio
        self.transport, self.scheduler, self.outbox = transport, scheduler, outbox
        self.queue = PrefillQueue(engine_id)
        self._reqs: dict[str, _Req] = {}
        self._lock = threading.Lock()
        self._orphans: dict[str, list[TransferItem]] = {}  # items that beat their task here
        self._orphan_t: dict[str, float] = {}  # first arrival of each orphan key (for purging)

    # ------------------------------------------------------------------ load / admin
    def load(self) -> tuple[int, int]:
        with self._lock:
            return len(self._reqs), sum(len(r.task.prompt_token_ids) for r in self._reqs.values())

    def add(self, task: PrefillTask) -> None:
        n, bs = len(task.prompt_token_ids), self.geo.block_size
        req = _Req(task=task, kv=self.geo.alloc(n), dest=f"e{task.decode_engine}",
                   pe_ready=task.pe_read_len == 0,
                   de_layers_left=self.geo.num_layers if task.de_read_len else 0)
        with self._lock:
            self._reqs[task.request_id] = req
            self.queue.add(task.request_id, task.hit_len, n - task.hit_len)
            self._orphan_t.pop(task.request_id, None)
            self._deliver_locked(self._orphans.pop(task.request_id, []))
        if task.pe_read_len:
            rid = task.request_id
            self.io.read_blocks(task.prompt_token_ids, 0, task.pe_read_len // bs, req.kv, "pe-read",
                                lambda err: self._read_done(rid, err))

    def _read_done(self, rid: str, err: BaseException | None) -> None:
        with self._lock:
            req = self._reqs.get(rid)
            if req is None:
                return
            if err is not None:
                req.failed = f"prefill engine {self.engine_id} read failed: {err}"
            req.pe_ready = True
        self.outbox.put(Progress(request_id=rid, engine_id=self.engine_id, event="read_done"))

    def cancel(self, rid: str) -> None:
        with self._lock:
            self._reqs.pop(rid, None)
            self._orphans.pop(rid, None)
            self.queue.remove(rid)

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        """Hit KV Layer Blocks read on the DE side (copied into the request's buffer)."""
        with self._lock:
            self._deliver_locked(items)

    def _hold(self, it: TransferItem) -> None:
        _hold_item(self._orphans, self._orphan_t, it)

    def _deliver_locked(self, items: Sequence[TransferItem]) -> None:
        for it in items:
            req = self._reqs.get(it.key)
            if req is None:
                self._hold(it)
                continue
            a, b = it.token_offset, it.token_offset + it.num_tokens
            src = torch.frombuffer(it.payload, dtype=self.geo.dtype)  # type: ignore[arg-type]
            req.kv[it.layer, a:b].copy_(src.view(b - a, 2, self.geo.num_kv_heads, self.geo.head_dim))
            req.de_layers_left -= 1

    # ------------------------------------------------------------------ compute
    def has_work(self) -> bool:
        with self._lock:
            return any(r.ready or r.failed for r in self._reqs.values())

    def step(self) -> bool:
        """Run one planned batch if any request is ready; returns whether it did anything."""
        with self._lock:
            for rid in [r for r, q in self._reqs.items() if q.failed]:
                req = self._reqs.pop(rid)
                self.queue.remove(rid)
                self.outbox.put(Progress(request_id=rid, engine_id=self.engine_id, event="failed",
                                         error=req.failed))
            ready = {r for r, q in self._reqs.items() if q.ready}
            if not ready:
                return False
            plan = self.scheduler.plan_prefill_batch(self.queue.view(time.monotonic(), ready))
            reqs = [self._reqs[e.request_id] for e in plan.entries]
        if not plan.entries:
            return False
        self._run(plan.entries, reqs)
        return True

    @torch.inference_mode()
    def _run(self, entries: Sequence[object], reqs: list[_Req]) -> None:
        spans = [Span(e.cached_len, e.chunk_len) for e in entries]  # type: ignore[attr-defined]
        ids = [t for e, r in zip(entries, reqs) for t in
               r.task.prompt_token_ids[e.cached_len:e.cached_len + e.chunk_len]]  # type: ignore[attr-defined]
        h = self.decoder.embed(ids)
        rope = self.decoder.rope(self.decoder.positions(spans))
        for layer in range(self.geo.num_layers):
            cached = [r.kv[layer, :s.cached_len] if s.cached_len else None for s, r in zip(spans, reqs)]
            h, new_kv = self.decoder.run_layer(layer, h, spans, cached, rope)
            off = 0
            for s, r in zip(spans, reqs):
                r.kv[layer, s.cached_len:s.cached_len + s.new_len].copy_(new_kv[off:off + s.new_len])
                off += s.new_len
                self._send_layer(r, layer, s)
        ends = np.cumsum([s.new_len for s in spans]) - 1
        finished = [(r, int(end)) for s, r, end in zip(spans, reqs, ends)
                    if s.cached_len + s.new_len == len(r.task.prompt_token_ids)]
        logits = self.decoder.final(h[[end for _, end in finished]]) if finished else None
        for s, r in zip(spans, reqs):
            r.sent_hit = True
            with self._lock:
                self.queue.advance(r.task.request_id, s.new_len)
        for i, (r, _) in enumerate(finished):
            assert logits is not None
            tok = sample(logits[i], r.task.params, 0)
            marker = TransferItem(key=r.task.request_id, block_index=-1, layer=DONE_LAYER,
                                  num_tokens=1, payload=np.array([tok], dtype=np.int64).tobytes())
            self.transport.submit(r.dest, [marker], source=f"e{self.engine_id}")
            with self._lock:
                self._reqs.pop(r.task.request_id, None)
            self.outbox.put(Progress(request_id=r.task.request_id, engine_id=self.engine_id,
                                     event="prefill_done"))

    def _send_layer(self, r: _Req, layer: int, s: Span) -> None:
        """This layer's KV the DE does not have yet: the PE-read hits (first chunk) + the chunk."""
        items = []
        if not r.sent_hit and r.task.pe_read_len:
            items.append(self._item(r, layer, 0, r.task.pe_read_len))
        items.append(self._item(r, layer, s.cached_len, s.cached_len + s.new_len))
        self.transport.submit(r.dest, items, source=f"e{self.engine_id}")

    def _item(self, r: _Req, layer: int, a: int, b: int) -> TransferItem:
        return TransferItem(key=r.task.request_id, block_index=a // self.geo.block_size, layer=layer,
                            num_tokens=b - a, token_offset=a, payload=r.kv[layer, a:b])


ORPHAN_TTL_S = 60.0  # items of a request whose task never comes (cancelled meanwhile) are dropped


def _hold_item(orphans: dict[str, list[TransferItem]], first_s: dict[str, float],
               it: TransferItem) -> None:
    """Keep a copy of an item that arrived before its task; purge keys older than ORPHAN_TTL_S."""
    now = time.monotonic()
    if it.key not in orphans:
        for key in [k for k, t in first_s.items() if now - t > ORPHAN_TTL_S]:
            orphans.pop(key, None)
            first_s.pop(key, None)
        first_s[it.key] = now
    orphans.setdefault(it.key, []).append(_copy(it))


def _copy(it: TransferItem) -> TransferItem:
    return TransferItem(key=it.key, block_index=it.block_index, layer=it.layer,
                        num_tokens=it.num_tokens, token_offset=it.token_offset,
                        payload=bytes(it.payload))  # type: ignore[arg-type]
