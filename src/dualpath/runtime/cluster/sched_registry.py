"""The scheduler core's side of engines joining: a hello registers an engine (or is refused:
a taken data address, a different model/KV geometry), the first one sets up the block store and the
policy's scheduler from the KV geometry, and a Configure rebuilds that policy when idle.
``SchedulerCore`` (``sched_core.py``) inherits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from dualpath.policy import Scheduler, SchedulerConfig, make_scheduler
from dualpath.runtime.cluster.kv_backend import open_cluster_store
from dualpath.runtime.cluster.messages import (
    Configure,
    EngineHello,
    EngineReady,
    QueryReply,
    Shutdown,
    Welcome,
)
from dualpath.runtime.cluster.state import ClusterState, EngineState
from dualpath.runtime.kvstore import BlockStore

if TYPE_CHECKING:
    from dualpath.runtime.cluster.config import ClusterConfig, SchedulerArgs
    from dualpath.runtime.cluster.read_rate import StorageReadRate
    from dualpath.runtime.cluster.sched_info import Reporter
    from dualpath.runtime.cluster.supervisor_view import SupervisionView
    from dualpath.runtime.transfer.drops import DropCounter


class EngineRegistry:
    """Needs the core's ``args``, ``state``, ``sched``, ``store``, ``hello``, ``report``,
    ``supervision``, ``drops``, ``_read_rate``, ``_send`` and the peers broadcast."""

    args: SchedulerArgs
    state: ClusterState
    sched: Scheduler | None
    store: BlockStore | None
    hello: EngineHello | None
    report: Reporter
    supervision: SupervisionView
    drops: DropCounter
    _read_rate: StorageReadRate

    if TYPE_CHECKING:

        def _send(self, identity: bytes, msg: object) -> None: ...

        def _peers(self) -> dict[int, str]: ...

        def _broadcast_peers(self) -> None: ...

        def settings_changed(self) -> None: ...

        def registered_again(self, eid: int, ident: bytes, now: float) -> None: ...

    def _engine_of(self, ident: bytes) -> EngineState | None:
        """The registered engine whose main socket is ``ident`` (None: not an engine)."""
        for e in self.state.engines.values():
            if e.identity == ident:
                return e
        return None

    # ------------------------------------------------------------------ engines
    def _hello(self, ident: bytes, msg: EngineHello, now: float) -> None:
        """Register an engine; refuse (Shutdown with the reason) one whose data address a live
        engine already has, or whose model/KV geometry differs from the cluster's."""
        same = self.state.engines.get(msg.engine_id)
        if (
            same is not None
            and same.alive
            and (same.pid, same.generation, same.data_addr) == (msg.pid, msg.generation, msg.data_addr)
        ):  # (the same process again: a second "register again" crossed its first hello)
            self.registered_again(msg.engine_id, ident, now)
            self._welcome(ident, msg.engine_id)
            return
        refusal = self._refusal(msg)
        if refusal is not None:
            why, cause = refusal
            self.drops.drop("control", cause, why)
            self._send(ident, Shutdown(reason=f"refused: {why}"))
            return
        self.supervision.on_hello(msg)  # the same engine restarted: its old self dies first
        eid = msg.engine_id
        if eid < 0 or (eid in self.state.engines and self.state.engines[eid].alive):
            eid = max(self.state.engines, default=-1) + 1
        self.state.add_engine(_engine_state(eid, msg, ident, now))
        self.supervision.registered(eid, msg.pid)
        if self.sched is None:
            self._setup(msg)
        self._welcome(ident, eid)

    def _refusal(self, msg: EngineHello) -> tuple[str, str] | None:
        """Why (and the drop cause) a hello is refused: a live engine's data address, another
        model/KV geometry, or a generation its successor replaced; None to register it."""
        taken = [e.engine_id for e in self.state.engines.values() if e.alive and e.data_addr == msg.data_addr]
        if taken:
            return f"data address {msg.data_addr} is engine {taken[0]}'s", "duplicate_address"
        if self.hello is not None and msg.geometry() != self.hello.geometry():
            return (
                (
                    f"a {msg.role} engine's model/KV geometry {msg.geometry()} differs from "
                    f"the cluster's {self.hello.geometry()}"
                ),
                "mismatch",
            )
        old = self.state.engines.get(msg.engine_id)
        if old is not None and msg.generation < old.generation:  # (a process its successor replaced)
            return (
                f"engine {msg.engine_id} generation {msg.generation} is stale (now {old.generation})",
                "stale",
            )
        return None

    def _welcome(self, ident: bytes, eid: int) -> None:
        self._send(
            ident, Welcome(engine_id=eid, is_leader=self._leads(self.state.engines[eid]), peers=self._peers())
        )
        self._send(ident, self.settings())  # what Configure set reaches a (re)started engine too
        self._broadcast_peers()

    def _leads(self, e: EngineState) -> bool:
        """Is ``e`` its node's group leader (the lowest live id of its role there)?"""
        node = [x.engine_id for x in self.state.groups(e.role, alive_only=False)[e.node_id] if x.alive]
        return min(node) == e.engine_id

    def _ready(self, ident: bytes, msg: EngineReady) -> None:
        """An engine has its caches and worker: routable from now on (only from its own socket)."""
        e = self.state.engines.get(msg.engine_id)
        if e is None or e.identity != ident or e.pid != msg.pid:
            self.drops.drop("control", "unknown_engine", f"ready of engine {msg.engine_id} (pid {msg.pid})")
            return
        e.rss_bytes = msg.rss_bytes
        if not e.ready:
            self.state.mark_ready(e.engine_id)
            print(f"scheduler: {e.role} engine {e.engine_id} (pid {e.pid}) ready", flush=True)

    def settings(self) -> Configure:
        """The operator settings now, complete (a cap None is sent as a reset to uncapped)."""
        c = self.args.cluster
        reset = ("snic_gbps",) if c.traffic.snic_gbps is None else ()
        return Configure(query_id=0, policy=c.policy, read_free=c.traffic.read_free,
                         snic_gbps=c.traffic.snic_gbps, reset=reset)  # fmt: skip

    def _setup(self, msg: EngineHello) -> None:
        from dualpath.runtime.kvstore import BlockLayout

        self.hello = msg
        layout = BlockLayout(
            num_layers=msg.num_layers,
            block_size=msg.block_size,
            kv_bytes_per_token_layer=msg.kv_bytes_per_token_layer,
        )
        cap, cluster = self.args.kv_capacity_bytes, self.args.cluster
        if self.store is None or self.store.layout != layout:  # (kept across Configure)
            self.store = open_cluster_store(cluster, layout, "auto" if cap is None else cap)
        snic = self._read_bytes_per_s()
        cfg = SchedulerConfig.from_rates(
            snic_bytes_per_s=snic,
            kv_bytes_per_token=layout.kv_bytes_per_token,
            prefill_tokens_per_s=cluster.scheduler.beta_rate(cluster.model),
            batching="tokens",
            block_size=msg.block_size,
            **cluster.scheduler.policy_overrides(),
        )
        self.state.ledger.set_read_rate(snic / layout.kv_bytes_per_token)
        self.sched = make_scheduler(cluster.policy, cfg)

    def _read_bytes_per_s(self) -> float:
        """A node's storage read rate behind alpha (``runtime/cluster/read_rate.py``)."""
        return self._read_rate.bytes_per_s(self.args.cluster)

    @property
    def read_rate_source(self) -> str:
        return self._read_rate.source

    def _configure(self, msg: Configure) -> QueryReply:
        """Change the operator settings (idle only); engines get the complete result."""
        from dualpath.core.errors import DualpathError

        query_id = msg.query_id
        if self.report.timing:
            return QueryReply(query_id=msg.query_id, error="requests are in flight; configure when idle")
        if self.hello is None:
            return QueryReply(query_id=msg.query_id, error="no engine registered yet")
        try:
            self.args = msgspec.structs.replace(self.args, cluster=configured(self.args.cluster, msg))
            self._setup(self.hello)
        except DualpathError as exc:
            return QueryReply(query_id=msg.query_id, error=str(exc))
        self.settings_changed()
        msg = self.settings()
        for e in self.state.engines.values():
            if e.alive:
                self._send(e.identity, msg)
        return QueryReply(query_id=query_id, health=self.report.health())


def configured(c: ClusterConfig, msg: Configure) -> ClusterConfig:
    """``c`` with what ``msg`` sets (None keeps a setting; ``reset`` returns it to its default)."""
    from dualpath.runtime.cluster.config import DEFAULT_POLICY

    policy = DEFAULT_POLICY if "policy" in msg.reset else (msg.policy or c.policy)
    read_free = False if "read_free" in msg.reset else (
        c.traffic.read_free if msg.read_free is None else msg.read_free)  # fmt: skip
    snic = (
        None
        if "snic_gbps" in msg.reset
        else (c.traffic.snic_gbps if msg.snic_gbps is None else msg.snic_gbps)
    )
    traffic = msgspec.structs.replace(c.traffic, snic_gbps=snic, read_free=read_free)
    return msgspec.structs.replace(c, policy=policy, traffic=traffic)


def _engine_state(eid: int, msg: EngineHello, ident: bytes, now: float) -> EngineState:
    """The scheduler's record of a newly registered engine, from its hello."""
    return EngineState(
        engine_id=eid,
        role=msg.role,
        node_id=msg.node_id,
        hbm_tokens=msg.hbm_tokens,
        last_seen_s=now,
        data_addr=msg.data_addr,
        identity=ident,
        ready=msg.ready,
        pid=msg.pid,
        generation=msg.generation,
        weights_bytes=msg.weights_bytes,
        kv_pool_bytes=msg.kv_pool_bytes,
        max_prompt_tokens=msg.max_prompt_tokens,
        max_context_tokens=msg.max_context_tokens,
    )
