"""The scheduler core's side of engines joining: a hello registers an engine (or is refused:
a taken data address, a different model/KV geometry), the first one sets up the block store and the
policy's scheduler from the KV geometry, and a Configure rebuilds that policy when idle.
``SchedulerCore`` (``sched_core.py``) inherits it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from dualpath.policy import Scheduler, SchedulerConfig, make_scheduler
from dualpath.runtime.cluster.messages import (
    Configure,
    EngineHello,
    QueryReply,
    Shutdown,
    Welcome,
)
from dualpath.runtime.cluster.state import ClusterState, EngineState
from dualpath.runtime.kvstore import BlockStore

if TYPE_CHECKING:
    from dualpath.runtime.cluster.config import SchedulerArgs
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
        why, cause = None, ""
        taken = [e.engine_id for e in self.state.engines.values() if e.alive and e.data_addr == msg.data_addr]
        if taken:
            why, cause = f"data address {msg.data_addr} is engine {taken[0]}'s", "duplicate_address"
        elif self.hello is not None and msg.geometry() != self.hello.geometry():
            why, cause = (
                (
                    f"a {msg.role} engine's model/KV geometry {msg.geometry()} differs from "
                    f"the cluster's {self.hello.geometry()}"
                ),
                "mismatch",
            )
        if why is not None:
            self.drops.drop("control", cause, why)
            self._send(ident, Shutdown(reason=f"refused: {why}"))
            return
        self.supervision.on_hello(msg)  # the same engine restarted: its old self dies first
        eid = msg.engine_id
        if eid < 0 or (eid in self.state.engines and self.state.engines[eid].alive):
            eid = max(self.state.engines, default=-1) + 1
        self.state.add_engine(
            EngineState(
                engine_id=eid,
                role=msg.role,
                node_id=msg.node_id,
                hbm_tokens=msg.hbm_tokens,
                last_seen_s=now,
                data_addr=msg.data_addr,
                identity=ident,
            )
        )
        self.supervision.registered(eid, msg.pid)
        if self.sched is None:
            self._setup(msg)
        leader = min(e.engine_id for e in self.state.groups(msg.role)[msg.node_id])
        self._send(ident, Welcome(engine_id=eid, is_leader=leader == eid, peers=self._peers()))
        self._broadcast_peers()

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
            self.store = BlockStore(
                cluster.kv_dir, layout, "auto" if cap is None else cap, file_mode=cluster.kv_file_mode
            )
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
        from dualpath.core.errors import DualpathError

        if self.report.timing:
            return QueryReply(query_id=msg.query_id, error="requests are in flight; configure when idle")
        if self.hello is None:
            return QueryReply(query_id=msg.query_id, error="no engine registered yet")
        try:
            c = self.args.cluster
            snic = c.traffic.snic_gbps if msg.snic_gbps is None else msg.snic_gbps
            c = msgspec.structs.replace(
                c,
                policy=msg.policy,
                traffic=msgspec.structs.replace(c.traffic, snic_gbps=snic, read_free=msg.read_free),
            )
            self.args = msgspec.structs.replace(self.args, cluster=c)
            self._setup(self.hello)
        except DualpathError as exc:
            return QueryReply(query_id=msg.query_id, error=str(exc))
        for e in self.state.engines.values():
            if e.alive:
                self._send(e.identity, msg)
        return QueryReply(query_id=msg.query_id, health=self.report.health())
