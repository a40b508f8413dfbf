"""The runtime's TraceDriver for ``dualpath.policy.traces.replay_traces``: the scheduler service's
own event handling (``scheduler.SchedulerCore``), fed the trace as the messages a cluster sends.

Engines register with ``EngineHello``; reads and prefills done are engines' ``Progress``, a finish
is the DE's last ``Tokens`` event, a fetch round is the service's ``tick`` (which dispatches
``DecodeTask`` / ``PrefillTask``), an engine lost is the service's ``engine_died`` (requeue or
fail by ``policy.recovery``, with the attempt keys and cancels that go with it). Messages go
through the codec (``handle`` decodes and validates them as the socket loop does); what the core
sends is recorded instead of put on a socket. Only the store lookup of a Submit is skipped: a
trace's arrival says how many tokens hit (``SchedulerCore.admit``), and the scheduler is the
trace's (policy, config, read rate, fetch order, view bounds) rather than one derived from the
engines' KV geometry. The applied plans are the service's ``ClusterState``'s; every dispatch is
checked against the plan that placed it (``dispatch_errors``).
"""

from __future__ import annotations

from dualpath.policy import make_scheduler
from dualpath.policy import views as pv
from dualpath.policy.ledger import Entry
from dualpath.policy.traces import Trace
from dualpath.runtime.cluster.api import SamplingParams, TokenEvent
from dualpath.runtime.cluster.config import ClusterConfig, SchedulerArgs
from dualpath.runtime.cluster.messages import (
    DecodeTask,
    EngineHello,
    PrefillTask,
    Progress,
    ReadPlan,
    Tokens,
    encode,
)
from dualpath.runtime.cluster.sched_core import SchedulerCore
from dualpath.runtime.cluster.state import ClusterState

CLIENT = b"client"
_GEOMETRY = {"num_layers": 2, "kv_bytes_per_token_layer": 64, "block_size": 64, "vocab_size": 512}


def _ident(engine_id: int) -> bytes:
    return f"e{engine_id}".encode()


class _RecordingCore(SchedulerCore):
    """The service's core whose messages are kept, in order, as (identity, message)."""

    def __init__(self, args: SchedulerArgs) -> None:
        super().__init__(args)
        self.sent: list[tuple[bytes, object]] = []

    def _send(self, identity: bytes, msg: object) -> None:
        self.sent.append((identity, msg))

    def _to_client(self, identity: bytes, msg: object) -> None:
        self.sent.append((identity, msg))


class RuntimeTraceDriver:
    """``make_driver`` for ``replay_traces``: ``RuntimeTraceDriver(trace)``."""

    def __init__(self, trace: Trace) -> None:
        cluster = ClusterConfig(kv_dir="unused-by-traces", policy=trace.policy)
        self.core = core = _RecordingCore(SchedulerArgs(cluster=cluster))
        core.sched = make_scheduler(trace.policy, trace.config)  # (instead of _setup's)
        core.state = ClusterState(read_tokens_per_s=trace.read_tokens_per_s, order=trace.order)
        core.state.ledger.bounds = trace.bounds
        core.state.log = []
        self.now_s = 0.0
        self.dispatch_errors: list[str] = []
        for eid, node, side in trace.engines():
            hello = EngineHello(
                engine_id=eid,
                role="prefill" if side == "pe" else "decode",
                node_id=node,
                data_addr=f"tcp://trace-e{eid}:{5000 + eid}",
                pid=1000 + eid,
                hbm_tokens=trace.de_hbm_tokens if side == "de" else 0,
                max_context_len=1 << 20,
                **_GEOMETRY,
            )
            core.hello = core.hello or hello
            core.handle(_ident(eid), encode(hello), self.now_s)
        assert sorted(core.state.engines) == sorted(e for e, _n, _s in trace.engines()), "registration"

    def _key(self, request_id: str) -> str:
        return self.core.current[request_id]

    def arrive(self, request: pv.RequestInfo) -> None:
        prompt = [7] * (request.cached_len + request.new_len)
        params = SamplingParams(max_tokens=request.gen_len, ignore_eos=True)
        self.core.admit(CLIENT, request.request_id, prompt, params, request.cached_len, self.now_s)

    def tick(self, now_s: float) -> None:
        self.now_s = now_s
        log = self.core.state.log
        assert log is not None
        plans_before, sent_before = len(log), len(self.core.sent)
        self.core.tick(now_s)
        self._check_dispatches(log[plans_before:], self.core.sent[sent_before:])

    def _check_dispatches(self, plans: list, sent: list[tuple[bytes, object]]) -> None:
        """Each request a prefill plan placed got a DecodeTask to its DE, then a PrefillTask to its
        PE, carrying the plan's read split; nothing else was dispatched."""
        want: dict[str, tuple[bytes, bytes, ReadPlan]] = {}
        for kind, _node, plan in plans:
            if kind != "prefill":
                continue
            for a in plan.assignments:
                entry = self.core.state.requests[a.request_id]
                want[self._key(a.request_id)] = (_ident(entry.de), _ident(a.engine_id), ReadPlan.of(a))
        got: dict[str, list[tuple[str, bytes, ReadPlan]]] = {}
        for ident, msg in sent:
            if isinstance(msg, DecodeTask | PrefillTask):
                kind = "decode" if isinstance(msg, DecodeTask) else "prefill"
                got.setdefault(msg.request_id, []).append((kind, ident, msg.read))
        for key, (de, pe, read) in want.items():
            if got.pop(key, None) != [("decode", de, read), ("prefill", pe, read)]:
                self.dispatch_errors.append(f"t={self.now_s:g}: {key} not dispatched as planned")
        self.dispatch_errors.extend(f"t={self.now_s:g}: {key} dispatched unplanned" for key in got)

    def _placed(self, request_id: str, event: str) -> Entry | None:
        """The request's entry when the service placed it as the trace expects; else None and
        the divergence noted (the event is skipped; the plans will then differ too)."""
        entry = self.core.state.requests.get(request_id)
        if entry is None or entry.pe < 0:
            self.dispatch_errors.append(f"t={self.now_s:g}: {event} of {request_id}, which is not placed")
            return None
        return entry

    def read_done(self, request_id: str, node_id: int) -> None:
        entry = self._placed(request_id, "read_done")
        on_node = (
            [e for e in (entry.pe, entry.de) if self.core.state.engines[e].node_id == node_id]
            if entry
            else []
        )
        if entry is None or not on_node:
            self.dispatch_errors.append(f"t={self.now_s:g}: read_done of {request_id} on node {node_id}")
            return
        msg = Progress(request_id=self._key(request_id), engine_id=on_node[0], event="read_done")
        self.core.handle(_ident(on_node[0]), encode(msg), self.now_s)

    def prefill_done(self, request_id: str) -> None:
        entry = self._placed(request_id, "prefill_done")
        if entry is None:
            return
        msg = Progress(
            request_id=self._key(request_id),
            engine_id=entry.pe,
            event="prefill_done",
            hit_len=entry.info.cached_len,
        )
        self.core.handle(_ident(entry.pe), encode(msg), self.now_s)

    def finished(self, request_id: str) -> None:
        entry = self._placed(request_id, "finished")
        if entry is None:
            return
        last = TokenEvent(request_id=self._key(request_id), index=0, token_id=5, finish_reason="length")
        self.core.handle(_ident(entry.de), encode(Tokens(events=[last])), self.now_s)

    def engine_lost(self, engine_id: int) -> None:
        self.core.engine_died(engine_id, f"engine {engine_id} lost (conformance trace)")

    def plans(self) -> list:
        assert self.core.state.log is not None
        return self.core.state.log
