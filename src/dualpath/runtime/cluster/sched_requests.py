"""The scheduler core's side of requests: a Submit checked and admitted into the queue (its
prefix hit looked up in the store), progress and token events of the engines routed to the request's
client (RequestStats on the last token), and a failure, cancellation or finish dropping the
request's state. The first token of each attempt comes from its PE (``Progress`` "prefill_done"
with ``first_token``) and is streamed at once unless it ends the request (then the DE's last event,
sent after its persists, carries it); ``sched_stream.Streams`` puts the tokens of both engines in
order, once. ``SchedulerCore`` (``sched_core.py``) inherits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from dualpath.policy.recovery import resumed_request
from dualpath.runtime.cluster.api import SamplingParams, TokenEvent
from dualpath.runtime.cluster.messages import Abort, Cancel, Progress, Rejected, Submit, Tokens
from dualpath.runtime.cluster.sched_stream import Streams
from dualpath.runtime.kvstore import BlockStore, loadable_hit_blocks

if TYPE_CHECKING:
    from dualpath.runtime.cluster.messages import EngineHello
    from dualpath.runtime.cluster.sched_info import Reporter
    from dualpath.runtime.cluster.state import ClusterState, EngineState
    from dualpath.runtime.transfer.drops import DropCounter

MAX_ERROR_CHARS = 2000  # error texts sent to clients (TokenEvent.error is bounded at decode)


def _seeded(params: SamplingParams) -> SamplingParams:
    """``params`` with a seed (``SamplingParams.with_seed``: the client that submitted it may have
    chosen it already; before, every unseeded request used 0)."""
    return params.with_seed()


class RequestLifecycle:
    """Needs the core's ``state``, ``store``, ``hello``, ``report``, ``drops``, request maps
    (``clients``, ``prompts``, ``keys``, ``current``, ``attempts``), ``_send``, ``_to_client``
    and ``_engine_of``."""

    state: ClusterState
    store: BlockStore | None
    hello: EngineHello | None
    report: Reporter
    drops: DropCounter
    clients: dict[str, bytes]
    prompts: dict[str, tuple[list[int], SamplingParams]]
    keys: dict[str, str]
    current: dict[str, str]
    attempts: dict[str, int]
    streams: Streams

    if TYPE_CHECKING:

        def _send(self, identity: bytes, msg: object) -> None: ...

        def _to_client(self, identity: bytes, msg: object) -> None: ...

        def _engine_of(self, ident: bytes) -> EngineState | None: ...

    def _submit(self, ident: bytes, msg: Submit, now: float) -> None:
        rid = msg.request_id
        reject = self.report.validate(msg, now)
        if reject is not None:
            self._to_client(ident, Rejected(request_id=rid, kind=reject[0], reason=reject[1]))
            return
        assert self.store is not None and self.hello is not None
        bs, ids = self.hello.block_size, [*msg.prompt_token_ids, *msg.generated]
        hit = min(len(self.store.match_prefix(ids)), loadable_hit_blocks(len(ids), bs)) * bs
        self.admit(ident, rid, list(msg.prompt_token_ids), msg.params, hit, now,
                   had=list(msg.generated), count=not msg.resubmitted)  # fmt: skip

    def admit(
        self, ident: bytes, rid: str, prompt: list[int], params: SamplingParams, hit_len: int, now: float,
        had: list[int] | None = None, count: bool = True,
    ) -> None:  # fmt: skip
        """Take a valid request of client ``ident`` whose first ``hit_len`` tokens the store holds
        into the queue (what a Submit becomes once checked against the store). ``had``: tokens its
        client has already (a request resubmitted after a scheduler restart goes on after them, as
        a request resumed after an engine's death does: ``policy.recovery.resumed_request``);
        ``count``: False for a resubmission (the dead scheduler counted it)."""
        self.clients[rid] = ident
        self.current[rid] = self.keys[rid] = rid
        self.prompts[rid] = (prompt, _seeded(params))
        self.streams.open(rid, had)
        self.report.submitted(rid, len(prompt), hit_len, now, count=count, had=len(had or ()))
        self.state.submit(
            resumed_request(rid, prompt_len=len(prompt), max_tokens=params.max_tokens,
                            generated=len(had or ()), hit_len=hit_len)
        )  # fmt: skip

    def _rid(self, key: str) -> str | None:
        """Client request id of an engine-facing key; None if stale (an earlier attempt)."""
        rid = self.keys.get(key)
        return rid if rid is not None and self.current.get(rid) == key else None

    def _progress(self, msg: Progress, now: float) -> None:
        rid = self._rid(msg.request_id)
        e = self.state.engines.get(msg.engine_id)
        if e is None:
            self.drops.drop("control", "unknown_engine", f"progress from engine {msg.engine_id}")
            return
        e.last_seen_s = now
        if rid is None:
            return
        req = self.state.requests.get(rid)
        if req is None or msg.engine_id not in (req.pe, req.de):
            self.drops.drop("control", "not_assigned", f"progress of {rid!r} from engine {msg.engine_id}")
            return
        if msg.event == "read_done" and e is not None:
            self.state.read_done(rid, e.node_id)
        elif msg.event == "prefill_done":
            self.state.prefill_done(rid)
            if msg.hit_len is not None:
                self.report.loaded(rid, msg.hit_len)
            if msg.first_token is not None and msg.engine_id == req.pe:
                self._first_token(rid, msg.first_token, now)
        elif msg.event == "failed":
            self._fail(rid, msg.error or "engine failure")

    def _first_token(self, rid: str, token: int, now: float) -> None:
        """The PE's token of this attempt (its index: the tokens the client had when the attempt
        began; the DE may have streamed it and more already): streamed now unless it ends the
        request (the DE's last event brings it, after the persists)."""
        params, index = self.prompts[rid][1], self.streams.base(rid)
        assert self.hello is not None
        if params.ends_with(token, index, self.hello.eos_token_id):
            return
        self._stream(rid, [TokenEvent(request_id=rid, index=index, token_id=token)], now)

    def _tokens(self, sender: bytes, msg: Tokens, now: float) -> None:
        de = self._engine_of(sender)
        if de is None or de.role != "decode":
            self.drops.drop("control", "unknown_engine", "token events not from a decode engine")
            return
        by_rid: dict[str, list[TokenEvent]] = {}
        for ev in msg.events:
            rid = self._rid(ev.request_id)
            req = self.state.requests.get(rid) if rid is not None else None
            if rid is None or req is None or rid not in self.clients:
                continue
            if req.de != de.engine_id:
                self.drops.drop("control", "not_assigned", f"tokens of {rid!r} from engine {de.engine_id}")
                continue
            self.streams.mark_de_started(rid)
            by_rid.setdefault(rid, []).append(msgspec.structs.replace(ev, request_id=rid))
        for rid, evs in by_rid.items():
            self._stream(rid, evs, now)

    def _stream(self, rid: str, events: list[TokenEvent], now: float) -> None:
        """Forward what ``events`` make due to the client (in order, once); the last one with
        RequestStats, after which the request is done."""
        out: list[TokenEvent] = []
        for ev in events:
            out.extend(self.streams.accept(rid, ev))
        if not out:
            return
        ident, req = self.clients[rid], self.state.requests[rid]
        for i, ev in enumerate(out):
            if ev.is_last:
                out[i] = msgspec.structs.replace(ev, stats=self.report.stats(rid, req, now))
                del out[i + 1 :]
                break
            self.report.token(rid, now)
        self._to_client(ident, Tokens(events=out))
        if out[-1].is_last:
            self._drop(rid, cancel=False)

    def _abort(self, msg: Abort, now: float) -> None:
        """The client went away ("cancelled": counted so), has what it wanted ("stop", a stop
        string: counted finished, with its times) or gave up ("failed", its token timeout):
        cancel it on its engines (each drops it at its next step: a chunk or a decode step),
        unless it ended."""
        rid = msg.request_id
        req = self.state.requests.get(rid) if rid in self.clients else None
        if req is not None and msg.reason == "stop":
            self.report.stats(rid, req, now, count_token=False)
        elif req is not None and msg.reason == "failed":
            self.report.failed(rid)
        elif req is not None:
            self.report.cancelled(rid)
        self._drop(rid, cancel=True)

    def _fail(self, rid: str, error: str) -> None:
        error = error[:MAX_ERROR_CHARS]
        ident = self.clients.get(rid)
        if ident is not None:
            self._to_client(
                ident,
                Tokens(
                    events=[
                        TokenEvent(
                            request_id=rid,
                            index=self.report.num_tokens(rid),
                            token_id=-1,
                            finish_reason="error",
                            error=error,
                        )
                    ]
                ),
            )
        self.report.failed(rid)
        self._drop(rid, cancel=True)

    def _drop(self, rid: str, cancel: bool) -> None:
        req = self.state.finish(rid)
        if req is not None and cancel:
            for eid in (req.pe, req.de):
                if eid >= 0 and self.state.engines[eid].alive:
                    self._send(self.state.engines[eid].identity, Cancel(request_id=self.current[rid]))
        self.keys.pop(self.current.pop(rid, ""), None)
        self.attempts.pop(rid, None)
        self.clients.pop(rid, None)
        self.prompts.pop(rid, None)
        self.streams.close(rid)
        self.report.forget(rid)
