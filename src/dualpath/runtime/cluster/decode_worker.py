"""Decode engine worker: owns each request's prompt KV buffer (the DE buffer), reads its share of the
hit KV (DE read path) and streams it to the PE layer by layer, receives the prompt KV the PE computes,
then decodes every started request in one batch per step, persisting each full block as it fills.

``deliver`` runs on the transport's receive thread, reads on the I/O thread; request state is touched
under ``_lock``. ``step`` runs on the engine's main thread. The last token event of a request is
emitted by the writer thread after the request's persists, so the next turn finds its blocks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dualpath.runtime.cluster.api import TokenEvent
from dualpath.runtime.cluster.kvio import DONE_LAYER, BlockIO, Geometry, Outbox, sample
from dualpath.runtime.cluster.messages import DecodeTask, Progress, Tokens
from dualpath.runtime.model import Decoder, Span
from dualpath.runtime.transfer.base import TransferItem, Transport


@dataclass(slots=True)
class _Req:
    task: DecodeTask
    kv: torch.Tensor
    tokens: list[int]
    ctx: int = 0  # tokens whose KV is in kv
    num_generated: int = 0
    persisted: int = 0  # blocks persisted (or known stored)
    started: bool = False
    done: bool = False


class DecodeWorker:
    def __init__(self, *, engine_id: int, node_id: int, decoder: Decoder, geo: Geometry,
                 blockio: BlockIO, transport: Transport, outbox: Outbox,
                 eos_token_id: int | None) -> None:
        self.engine_id, self.node_id = engine_id, node_id
        self.decoder, self.geo, self.io = decoder, geo, blockio
        self.transport, self.outbox, self.eos = transport, outbox, eos_token_id
        self._reqs: dict[str, _Req] = {}
        self._new: list[tuple[str, int]] = []  # (rid, first token) from PE markers
        self._lock = threading.Lock()
        self._orphans: dict[str, list[TransferItem]] = {}  # items that beat their task here
        self._orphan_t: dict[str, float] = {}  # first arrival of each orphan key (for purging)

    def load(self) -> tuple[int, int]:
        with self._lock:
            return len(self._reqs), sum(len(r.task.prompt_token_ids) + r.task.params.max_tokens
                                        for r in self._reqs.values())

    def add(self, task: DecodeTask) -> None:
        n, bs = len(task.prompt_token_ids), self.geo.block_size
        req = _Req(task=task, kv=self.geo.alloc(n + task.params.max_tokens),
                   tokens=list(task.prompt_token_ids), persisted=task.hit_len // bs)
        with self._lock:
            self._reqs[task.request_id] = req
            self._orphan_t.pop(task.request_id, None)
            self._deliver_locked(self._orphans.pop(task.request_id, []))
        if task.de_read_len:
            rid = task.request_id
            self.io.read_blocks(task.prompt_token_ids, task.pe_read_len // bs, task.de_read_len // bs,
                                req.kv, "de-read", lambda err: self._read_done(rid, err))

    def _read_done(self, rid: str, err: BaseException | None) -> None:
        with self._lock:
            req = self._reqs.get(rid)
        if req is None:
            return
        if err is not None:
            self._fail(rid, f"decode engine {self.engine_id} read failed: {err}")
            return
        self.outbox.put(Progress(request_id=rid, engine_id=self.engine_id, event="read_done"))
        t = req.task
        a, b = t.pe_read_len, t.pe_read_len + t.de_read_len
        for layer in range(self.geo.num_layers):  # DE buffer -> PE, one Layer Block batch per layer
            item = TransferItem(key=rid, block_index=a // self.geo.block_size, layer=layer,
                                num_tokens=b - a, token_offset=a, payload=req.kv[layer, a:b])
            self.transport.submit(f"e{t.prefill_engine}", [item], source=f"e{self.engine_id}")

    def _fail(self, rid: str, error: str) -> None:
        with self._lock:
            self._reqs.pop(rid, None)
        self.outbox.put(Progress(request_id=rid, engine_id=self.engine_id, event="failed", error=error))

    def cancel(self, rid: str) -> None:
        with self._lock:
            self._reqs.pop(rid, None)
            self._orphans.pop(rid, None)

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        """Prompt KV Layer Blocks from the PE, then its DONE_LAYER marker with the first token."""
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
            if it.layer == DONE_LAYER:
                self._new.append((it.key, int(np.frombuffer(it.payload, dtype=np.int64)[0])))  # type: ignore[arg-type]
                continue
            a, b = it.token_offset, it.token_offset + it.num_tokens
            src = torch.frombuffer(it.payload, dtype=self.geo.dtype)  # type: ignore[arg-type]
            req.kv[it.layer, a:b].copy_(src.view(b - a, 2, self.geo.num_kv_heads, self.geo.head_dim))

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._new) or any(r.started and not r.done for r in self._reqs.values())

    # ------------------------------------------------------------------ decode
    def step(self) -> bool:
        events: list[TokenEvent] = []
        with self._lock:
            new, self._new = self._new, []
            for rid, tok in new:
                req = self._reqs.get(rid)
                if req is not None:
                    req.started, req.ctx = True, len(req.task.prompt_token_ids)
                    self._emit(req, tok, events)
            batch = [r for r in self._reqs.values() if r.started and not r.done and r.num_generated > 0
                     and r.task.request_id not in {n[0] for n in new}]
        if batch:
            self._decode(batch, events)
        if events:
            self.outbox.put(Tokens(events=events))
        return bool(new or batch)

    @torch.inference_mode()
    def _decode(self, batch: list[_Req], events: list[TokenEvent]) -> None:
        spans = [Span(r.ctx, 1) for r in batch]
        h = self.decoder.embed([r.tokens[-1] for r in batch])
        rope = self.decoder.rope(self.decoder.positions(spans))
        for layer in range(self.geo.num_layers):
            h, new_kv = self.decoder.run_layer(layer, h, spans, [r.kv[layer, :r.ctx] for r in batch], rope)
            for i, r in enumerate(batch):
                r.kv[layer, r.ctx] = new_kv[i]
        logits = self.decoder.final(h)
        with self._lock:
            for i, r in enumerate(batch):
                r.ctx += 1
                if r.task.request_id in self._reqs:
                    self._emit(r, sample(logits[i], r.task.params, r.num_generated), events)

    def _emit(self, req: _Req, tok: int, events: list[TokenEvent]) -> None:
        """Record generated token ``tok``; persist newly full blocks; finish if it is the last."""
        p = req.task.params
        req.tokens.append(tok)
        index = req.num_generated
        req.num_generated += 1
        stop = tok in p.stop_token_ids or (not p.ignore_eos and tok == self.eos)
        reason = "length" if req.num_generated >= p.max_tokens else ("stop" if stop else None)
        full = req.ctx // self.geo.block_size
        if reason is None:
            if full > req.persisted:
                self.io.persist(req.tokens, req.kv, req.persisted, full)
                req.persisted = full
            events.append(TokenEvent(request_id=req.task.request_id, index=index, token_id=tok))
            return
        req.done = True
        last = TokenEvent(request_id=req.task.request_id, index=index, token_id=tok,
                          finish_reason=reason)
        rid = req.task.request_id
        if events:  # earlier events of this step must reach the scheduler first
            self.outbox.put(Tokens(events=list(events)))
            events.clear()

        def after() -> None:
            with self._lock:
                self._reqs.pop(rid, None)
            self.outbox.put(Tokens(events=[last]))

        self.io.persist(req.tokens, req.kv, req.persisted, full, after=after)
        req.persisted = full


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
