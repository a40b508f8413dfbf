"""Decode engine worker: the cluster's adapter around ``runtime/engine``'s ``DecodeEngine``.

The engine owns the DE buffer (each request's prompt KV while it is prefilled) and the paged decode
cache; this worker reserves buffer slots per ``DecodeTask``, reads the DE share of the request's
hit KV (its ``ReadPlan``) into them through this node's SNIC and announces it (``HitsLoaded``);
then, read side "de": serves it to the PE layer by layer, each layer when the PE asks for it
(``PullLayer``); "split": pushes every layer of it into the PE buffer. It hands the PE's Layer
Blocks to the buffer, starts decoding on the PE's ``PrefillDone`` (the first token) and turns the
engine's outputs into ``Tokens`` events (indexed from the task's ``num_generated``: a resumed
request continues its client's stream). Control messages are ``runtime/transfer/control.py``'s.

``deliver`` / ``control`` run on the transport's receive thread, reads complete on the I/O thread;
both touch request state under ``_lock``. ``step`` (and every engine call but buffer delivery) runs on the
engine's main thread. Persists run on the writer thread; the last token event of a request is
emitted there after them, so the next turn finds its blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from dualpath.core.errors import ConfigError
from dualpath.runtime.cluster.api import SamplingParams, TokenEvent
from dualpath.runtime.cluster.kvio import BlockIO, Geometry, Outbox
from dualpath.runtime.cluster.memory import KVPools
from dualpath.runtime.cluster.messages import DecodeTask, Progress, Tokens
from dualpath.runtime.cluster.worker_base import WorkerBase
from dualpath.runtime.engine import DecodeConfig, DecodeEngine, DecodeOutput
from dualpath.runtime.kvstore import chain_hashes
from dualpath.runtime.model import Decoder
from dualpath.runtime.transfer.base import TransferItem, Transport
from dualpath.runtime.transfer.control import Control, HitsLoaded, PrefillDone, PullLayer


class DecodeWorker(WorkerBase):
    def __init__(
        self,
        *,
        engine_id: int,
        node_id: int,
        decoder: Decoder,
        geo: Geometry,
        blockio: BlockIO,
        transport: Transport,
        outbox: Outbox,
        eos_token_id: int | None,
        pools: KVPools,
    ) -> None:
        """``pools``: the paged cache and buffer sizes (``memory.size_pools``)."""
        super().__init__()
        self.engine_id, self.node_id = engine_id, node_id
        self.geo, self.io, self.transport = geo, blockio, transport
        self.outbox, self.eos = outbox, eos_token_id
        # The engine's own endpoint is local only; ``e<id>`` is this worker (it routes to the buffer).
        self.engine = DecodeEngine(
            decoder,
            transport,
            blockio,
            DecodeConfig(  # type: ignore[arg-type]
                name=f"e{engine_id}.buffer",
                block_size=geo.block_size,
                buffer_bytes=pools.buffer_blocks * pools.block_bytes,
                num_cache_blocks=pools.cache_blocks,
            ),
        )
        self._reserved: set[str] = set()  # rids with DE buffer slots (KV may be delivered)
        self._reading: set[str] = set()  # rids whose DE-share reads are in flight
        self._new: list[tuple[str, int]] = []  # (rid, first token) from the PEs' PrefillDone
        self._blocked: list[tuple[str, int]] = []  # first token came, paged cache had no room yet
        self._generated: dict[str, int] = {}
        self.vocab_size: int = decoder.config.vocab_size

    def _task_tokens(self, task: DecodeTask) -> int:
        return len(task.prompt_token_ids) + task.params.max_tokens - task.num_generated

    def _admit_one(self, task: DecodeTask) -> bool:
        """DE buffer slots for the prompt, then the KV that came early, then this side's hit reads."""
        rid = task.request_id
        if not self.engine.reserve(rid, len(task.prompt_token_ids)):
            return False
        with self._lock:
            self._reserved.add(rid)
            for held in self._orphans.take(rid):  # in arrival order: KV, then PrefillDone
                if isinstance(held, TransferItem):
                    self._deliver_locked([held])
                else:
                    self._control_locked([held])
        if task.read.de_read_len:
            self._read_hits(task)
        return True

    def _read_hits(self, task: DecodeTask) -> None:
        bs, rid = self.geo.block_size, task.request_id
        first, num = task.read.pe_read_len // bs, task.read.de_read_len // bs
        hashes = chain_hashes(task.prompt_token_ids[: (first + num) * bs], bs)[first:]
        outs = self.engine.buffer.blocks(rid).arrays[first : first + num]
        with self._lock:
            self._reading.add(rid)
        self.io.read_into(hashes, outs, "de-read", lambda n, err: self._read_done(task, n, err))

    def _read_done(self, task: DecodeTask, num_read: int, err: BaseException | None) -> None:
        rid = task.request_id
        with self._lock:
            self._reading.discard(rid)
            live = rid in self._tasks
            if not live:  # cancelled while reading: its slots were kept for the read
                self.engine.buffer.free(rid)
        if not live:
            return
        if err is not None:
            self._fail(rid, f"decode engine {self.engine_id} read failed: {err}")
            return
        self.outbox.put_express(Progress(request_id=rid, engine_id=self.engine_id, event="read_done"))
        pe, read, me = f"e{task.prefill_engine}", task.read, f"e{self.engine_id}"
        a, end = read.pe_read_len, read.pe_read_len + num_read * self.geo.block_size  # a miss
        if read.side == "de":  # (vanished or corrupt block) ends the hits there
            self.transport.notify(pe, [HitsLoaded(key=rid, end_tokens=end)], source=me)  # the PE pulls
            return
        if end < read.hit_len:  # split: our share is cut
            self.transport.notify(pe, [HitsLoaded(key=rid, end_tokens=end)], source=me)
        if end == a:
            return
        for layer in range(self.geo.num_layers):  # split: our share -> PE buffer, a batch per layer
            items = self.engine.buffer.layer_items(rid, layer, a, end)
            self.transport.submit(pe, items, source=me)

    def _fail(self, rid: str, error: str) -> None:
        with self._lock:
            self._tasks.pop(rid, None)  # its slots are freed by the main thread's next step
        self.outbox.put(Progress(request_id=rid, engine_id=self.engine_id, event="failed", error=error))

    def cancel(self, rid: str) -> None:
        with self._lock:
            self._tasks.pop(rid, None)
            self._orphans.discard(rid)
            self._generated.pop(rid, None)
            self._reserved.discard(rid)
            if rid in self._reading:
                return  # the read's completion frees the slots
        self.engine.abort(rid)

    def control(self, source: str, msgs: Sequence[Control]) -> None:
        """From the PE: ``PullLayer`` (it computes that layer next: send its cached KV) and
        ``PrefillDone`` (all prompt KV is here; the first token)."""
        with self._lock:
            self._control_locked(msgs)

    def _control_locked(self, msgs: Sequence[Control]) -> None:
        for m in msgs:
            if isinstance(m, PullLayer):
                if m.key in self._reserved and m.key in self._tasks:
                    if m.layer >= self.geo.num_layers:  # (refused in the sender's ack)
                        raise ValueError(
                            f"{m.key}: layer {m.layer} pulled, the model has {self.geo.num_layers}"
                        )
                    pe = f"e{self._tasks[m.key].prefill_engine}"
                    self.transport.submit(
                        pe,
                        self.engine.buffer.layer_items(m.key, m.layer, m.start, m.stop),
                        source=f"e{self.engine_id}",
                    )
            elif not isinstance(m, PrefillDone):
                raise ValueError(f"{m.key}: a decode engine takes no {type(m).__name__}")
            elif m.key in self._reserved:
                self._new.append((m.key, m.first_token))  # (its range is checked in step)
            elif m.key not in self._generated:  # before its task (a duplicate after it: dropped)
                self._orphans.hold(m)

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None:
        """Prompt KV Layer Blocks from the PE (into the buffer)."""
        with self._lock:
            self._deliver_locked(items)

    def _deliver_locked(self, items: Sequence[TransferItem]) -> None:
        for it in items:
            if it.key not in self._reserved:
                if it.key not in self._generated:  # (late items of a started request: dropped)
                    self._orphans.hold(it)
                continue
            try:
                self.engine.buffer.deliver("", [it])
            except ConfigError:  # cancelled meanwhile
                pass

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._new or self._blocked) or self.engine.num_running > 0

    # ------------------------------------------------------------------ decode
    def step(self) -> bool:
        events: list[TokenEvent] = []
        self._drop_failed()
        self._admit_waiting()
        with self._lock:
            new, self._new = self._blocked + self._new, []
            self._blocked = []
        for rid, tok in new:
            task = self._tasks.get(rid)
            if task is None:
                continue
            try:
                if not 0 <= tok < self.vocab_size:
                    raise ValueError(
                        f"first token {tok} from the prefill engine is not in [0, {self.vocab_size})"
                    )
                params = self._sampling(task.params)
                k = task.num_generated
                if not self.engine.add_request(rid, task.prompt_token_ids, tok, params, num_generated=k):
                    self._blocked.append((rid, tok))
                    continue
            except Exception as exc:  # noqa: BLE001 - this request only
                self.fail_task(rid, "could not start decoding (see the engine log)", exc)
                continue
            with self._lock:
                self._reserved.discard(rid)
            done = params.ends_with(tok, k, None)  # (EOS is among the stop tokens here)
            self._emit(rid, tok, done, events)
        outs = self._decode_step()
        for out in outs:
            if out.request_id in self._tasks:
                self._emit(out.request_id, out.token, out.finished, events)
        if events:
            self.outbox.put(Tokens(events=events))
        return bool(new or outs)

    def _decode_step(self) -> list[DecodeOutput]:
        """One decode step of every running request. The batch is one forward pass, so when it
        raises the culprit cannot be told apart: every request in it fails (each with an error
        event, its cache blocks released) and the engine serves on. Inputs of a request are checked
        before it joins the batch (first token range, sampling parameters), and sampling cannot
        raise, so what remains is an engine fault."""
        try:
            return self.engine.step()
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                rids = [r for r in self._tasks if r in self._generated]
            for i, rid in enumerate(rids):  # (the traceback is logged once)
                self.fail_task(rid, "decode step failed (see the engine log)", exc if i == 0 else None)
            return []

    def _drop_failed(self) -> None:
        with self._lock:
            gone = [r for r in self._reserved if r not in self._tasks and r not in self._reading]
            self._reserved.difference_update(gone)
        for rid in gone:
            self.engine.abort(rid)

    def _sampling(self, p: SamplingParams) -> SamplingParams:
        """``p`` with the EOS token among its stop tokens unless ``ignore_eos`` (the engine
        stops on stop tokens only)."""
        if p.ignore_eos or self.eos is None:
            return p
        return msgspec.structs.replace(p, stop_token_ids=tuple(p.stop_token_ids) + (self.eos,))

    def _emit(self, rid: str, tok: int, finished: bool, events: list[TokenEvent]) -> None:
        """Record generated token ``tok``; the last one is sent after the request's persists.
        Events are indexed from the task's ``num_generated`` (a resumed request goes on from the
        tokens its client has). The first (the PE's token) is sent too, though the scheduler
        streamed it from the PE already: it drops the duplicate, and has it if the PE's is lost."""
        index = self._generated.get(rid, self._tasks[rid].num_generated)
        self._generated[rid] = index + 1
        if not finished:
            events.append(TokenEvent(request_id=rid, index=index, token_id=tok))
            return
        max_tokens = self._tasks[rid].params.max_tokens
        last = TokenEvent(
            request_id=rid,
            index=index,
            token_id=tok,
            finish_reason="length" if index + 1 >= max_tokens else "stop",
        )
        self._generated.pop(rid, None)
        if events:  # earlier events of this step must reach the scheduler first
            self.outbox.put(Tokens(events=list(events)))
            events.clear()

        def after() -> None:
            with self._lock:
                self._tasks.pop(rid, None)
            self.outbox.put(Tokens(events=[last]))

        self.io.after_writes(after)
