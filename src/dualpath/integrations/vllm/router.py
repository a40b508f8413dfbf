"""Which vLLM instances serve a request and which side reads its hit: ``dualpath.policy``'s decisions,
through the same ledger bookkeeping ``dualpath serve``'s scheduler keeps (``runtime/cluster/state``).

vLLM P/D disaggregation here: prefill instances (PEs) on their own nodes, decode instances (DEs) on
theirs, one engine per node. A request arrives with its prompt's hit in the shared store (whole
store blocks, the last prompt token always computed, as ``dualpath serve`` counts it); the policy's
fetch rounds pick its DE (decode fetch), then its PE and the read side from the nodes' read queues
(``read_q``: hit tokens dispatched to a node's reads and not yet done; PE reads queue on the PE's
node, DE reads on the DE's). The router keeps no decision of its own: a placed request's
:class:`Route` carries the policy's assignment as is. The proxy (proxy.py) reports when the prefill
finished (its reads are done then) and when the request finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.policy import SchedulerConfig, make_scheduler
from dualpath.policy import views as pv
from dualpath.policy.scheduler import POLICIES
from dualpath.runtime.cluster.state import ClusterState, EngineState, read_side
from dualpath.runtime.kvstore import BlockStore, loadable_hit_blocks


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    """One vLLM instance: ``role`` "prefill" or "decode", its node, its API URL and the URL of its
    node's agent (agent.py; the DE read path's reader on decode nodes)."""

    role: str
    node_id: int
    url: str
    agent_url: str = ""

    def __post_init__(self) -> None:
        require(self.role in ("prefill", "decode"), "role", self.role, "must be prefill or decode")


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """Where a placed request goes: the policy's PE and DE, read side and read split."""

    request_id: str
    prefill: Instance
    decode: Instance
    read_side: str  # "pe" | "de" | "split" | "none" (no hit)
    cached_len: int
    pe_read_len: int
    de_read_len: int

    def kv_transfer_params(self, *, snic: bool = True) -> dict[str, object]:
        """What the prefill request carries to its connector (settings.read_source reads it);
        ``snic=False``: the reads skip the emulated storage NICs (the no-I/O baseline)."""
        entry: dict[str, object] = {"read_side": "pe"}
        if self.read_side == "de":
            entry = {"read_side": "de", "agent_url": self.decode.agent_url}
        elif self.read_side == "split":  # the PE reads the first pe_read_len hit tokens, the DE the rest
            entry = {
                "read_side": "split",
                "agent_url": self.decode.agent_url,
                "pe_read_len": self.pe_read_len,
            }
        if not snic:
            entry["snic"] = False
        return {"dualpath": entry}


class Router:
    """Policy decisions for vLLM 1PnD (or nPmD); single-threaded (the proxy's event loop)."""

    def __init__(self, instances: Sequence[Instance], store: BlockStore, *, policy: str,
                 read_bytes_per_s: float, prefill_tokens_per_s: float = 250.0,
                 beta_tokens: int = 1 << 20, de_hbm_tokens: int = 1 << 22) -> None:  # fmt: skip
        roles = {i.role for i in instances}
        require(roles == {"prefill", "decode"}, "instances", [i.url for i in instances],
                "need at least one prefill and one decode instance")  # fmt: skip
        self.store, self.block_size = store, store.layout.block_size
        kv_per_token = store.layout.kv_bytes_per_token
        self.state = ClusterState(read_tokens_per_s=read_bytes_per_s / kv_per_token)
        self.engines: dict[int, Instance] = {}
        for eid, inst in enumerate(instances):
            self.engines[eid] = inst
            self.state.add_engine(EngineState(engine_id=eid, role=inst.role, node_id=inst.node_id,
                                              hbm_tokens=de_hbm_tokens if inst.role == "decode" else 0))  # fmt: skip
        self._rates = (read_bytes_per_s, kv_per_token, prefill_tokens_per_s, beta_tokens)
        self.set_policy(policy)

    def set_policy(self, policy: str) -> None:
        """Switch the policy (between runs: no request in flight)."""
        require(policy in POLICIES, "policy", policy, f"choices: {', '.join(POLICIES)}")
        require(not self.state.requests, "policy", policy, "cannot change with requests in flight")
        read_bytes_per_s, kv_per_token, prefill_tokens_per_s, beta_tokens = self._rates
        cfg = SchedulerConfig.from_rates(snic_bytes_per_s=read_bytes_per_s, kv_bytes_per_token=kv_per_token,
                                         prefill_tokens_per_s=prefill_tokens_per_s, batching="tokens",
                                         block_size=self.block_size, beta_tokens=beta_tokens)  # fmt: skip
        self.policy = policy
        self.sched = make_scheduler(policy, cfg)

    def hit_tokens(self, prompt_token_ids: Sequence[int]) -> int:
        n, bs = len(prompt_token_ids), self.block_size
        return min(len(self.store.match_prefix(list(prompt_token_ids))), loadable_hit_blocks(n, bs)) * bs

    def submit(self, request_id: str, prompt_token_ids: Sequence[int], max_tokens: int) -> int:
        """Queue a request; returns its hit (tokens)."""
        hit = self.hit_tokens(prompt_token_ids)
        self.state.submit(pv.RequestInfo(request_id=request_id, cached_len=hit,
                                         new_len=len(prompt_token_ids) - hit, gen_len=max_tokens))  # fmt: skip
        return hit

    def tick(self, now_s: float) -> list[Route]:
        """One fetch round of the policy; the requests it placed (both engines chosen)."""
        out = []
        for rid in self.state.fetch(self.sched, now_s):
            e = self.state.requests[rid]
            a = e.assignment
            assert a is not None and e.de >= 0
            out.append(Route(request_id=rid, prefill=self.engines[a.engine_id], decode=self.engines[e.de],
                             read_side=read_side(e), cached_len=e.info.cached_len, pe_read_len=a.pe_read_len,
                             de_read_len=a.de_read_len))  # fmt: skip
        return out

    def read_queues(self) -> dict[int, int]:
        """Hit tokens dispatched to each node's reads and not yet done."""
        return dict(self.state.ledger.read_q)

    def prefill_done(self, request_id: str) -> None:
        """The prefill instance answered: its reads (either side) and its prefill are done."""
        self.state.ledger.on_read_done(request_id)
        self.state.prefill_done(request_id)

    def finished(self, request_id: str) -> None:
        self.state.finish(request_id)
