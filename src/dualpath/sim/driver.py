"""The simulation driver: wires kernel, cluster, storage, engines and the policy adapter, and
carries each agent's turns through the pipeline (spec sections 3-4, 8-9):

arrival -> global queue -> DE fetch (HBM reserved) -> prefill queue -> PE fetch (PE, read side) ->
DRAM-buffer claims + storage reads -> PE iterations -> KV in DE buffer -> DE HBM -> decode -> next turn.
"""

from __future__ import annotations

import math
import random
from functools import partial

from dualpath.policy import ForwardAttentionPredictor, SchedulerConfig, make_scheduler
from dualpath.sim import calibration as cal
from dualpath.sim.adapter import VIEW_LIMIT, PolicyAdapter
from dualpath.sim.cluster import Cluster, Node
from dualpath.sim.config import SimConfig
from dualpath.sim.costs import CostCache
from dualpath.sim.decode import DecodeUnit, DeState
from dualpath.sim.kernel import PRIO_ARRIVAL, PRIO_COMPLETE, PRIO_FETCH, Handle, Kernel
from dualpath.sim.links import transfer3
from dualpath.sim.metrics import Metrics
from dualpath.sim.prefill import PeState, PrefillUnit
from dualpath.sim.request import Agent, Req
from dualpath.sim.storage import Storage


class Simulation:
    def __init__(self, config: SimConfig, agents: list[Agent]) -> None:
        self.config = config
        self.system = config.system
        self.free_io: bool = config.system.free_io  # (the system is frozen: hot paths read these)
        self.layerwise: bool = config.system.layerwise
        self.kernel = Kernel()
        self.cluster = cluster = Cluster(config.cluster)
        model = cluster.model
        self.bpt: int = model.kv_bytes_per_token
        self.block_len: int = config.block_len
        gpn = cluster.num_gpus_per_node
        pe_ep = len(cluster.prefill_units[0]) if cluster.prefill_units[0] else 1
        de_ep = len(cluster.decode_units[0]) if cluster.decode_units[0] else 1
        self.costs = CostCache(model, cluster.gpu_spec, name=config.cost_model, pe_ep_size=pe_ep,
                               de_ep_size=de_ep, num_gpus_per_node=gpn)
        from dualpath.cost import weight_bytes_per_gpu

        hbm = cluster.gpu_spec.hbm_gb * 1e9 * cal.HBM_USABLE_FRACTION
        de_kv = int((hbm - weight_bytes_per_gpu(model, ep_size=de_ep)) / self.bpt)
        self.pe_kv_tokens = max(0, int((hbm - weight_bytes_per_gpu(model, ep_size=pe_ep)) / self.bpt))
        if de_kv <= 0 or hbm < weight_bytes_per_gpu(model, ep_size=pe_ep):
            from dualpath.core.errors import ConfigError
            raise ConfigError("cluster", config.cluster.name, "weights do not fit in PE or DE HBM (use more nodes per EP group)")
        self.storage = Storage(self.kernel, cluster.nodes, self.bpt)
        self.max_de_tokens = de_kv
        self.pe_states = {g.gpu_id: PeState(g.gpu_id, g.node_id) for g in cluster.gpus
                          if g.role == "pe"}
        self.de_states = {g.gpu_id: DeState(g.gpu_id, g.node_id, de_kv) for g in cluster.gpus
                          if g.role == "de"}
        self.prefill_units = [PrefillUnit(self, [self.pe_states[g] for g in u])
                              for u in cluster.prefill_units]
        self.decode_units = [DecodeUnit(self, [self.de_states[g] for g in u])
                             for u in cluster.decode_units]
        forward = ForwardAttentionPredictor(layer=self.costs.predictor, num_layers=model.num_layers)
        sched_cfg = SchedulerConfig.from_rates(
            snic_bytes_per_s=cluster.nodes[0].snic.bytes_per_s, kv_bytes_per_token=self.bpt,
            prefill_tokens_per_s=self._prefill_tokens_per_s(),
            attention_predictor=forward,
            block_size=self.block_len, compute_quota_s=cal.COMPUTE_QUOTA_PER_FORWARD_S)
        self.de_node_tok = {n.node_id: 0 for n in cluster.de_nodes}  # sum of DE tok_e per node
        self.adapter = PolicyAdapter(self, make_scheduler(self.system.policy, sched_cfg))
        self.metrics = Metrics(self, config.out_dir)
        self.agents = agents
        self.agents_left = len(agents)
        self.rng = random.Random(config.seed)
        self._tick: Handle | None = None
        # PE units that skipped a request for lack of DE buffer
        self.starved_units: set[PrefillUnit] = set()
        self._de_dirty: set[int] = set()
        self._next_de = 0
        self._next_pe = 0
        self._pe_node_ids = [n.node_id for n in cluster.pe_nodes]
        pe_nodes = cluster.pe_nodes  # PE fetch orders, one per rotation (see _on_tick)
        self._pe_orders = [pe_nodes[i:] + pe_nodes[:i] for i in range(len(pe_nodes))]
        self._pe_dirty: set[int] = set(self._pe_node_ids)
        self._pe_all_dirty = False  # every PE node is dirty (set by assign_de, applied per tick)
        self.stopped_reason = ""

    def _prefill_tokens_per_s(self) -> float:
        """Prompt tokens/s one PE handles at the paper's workload shape (beta = 5 s of it)."""
        hit, new = 32_000, 512
        layer = self.costs.attention_layer_s([(hit, new)] * 4) + self.costs.other_layer_s(4 * new)
        return 4 * (hit + new) / self.costs.iteration_s(layer)

    # ------------------------------------------------------------------ arrivals
    def start(self) -> None:
        aps = self.config.aps
        t = 0.0
        for agent in self.agents:
            if aps is not None:
                t += self.rng.expovariate(aps)
            agent.t_start = t
            self.kernel.call_at(t, partial(self._issue, agent), PRIO_ARRIVAL)

    def _issue(self, agent: Agent) -> None:
        req = agent.next_request(self.block_len)
        if req is None:
            agent.t_end = self.kernel.now_s
            self.agents_left -= 1
            self.metrics.agent_done(agent)
            return
        req.t_arrive = self.kernel.now_s
        if req.decode_len > self.max_de_tokens:
            from dualpath.core.errors import ConfigError
            raise ConfigError("cluster", self.config.cluster.name,
                              f"a request needs {req.decode_len} tokens of DE HBM but a DE holds "
                              f"at most {self.max_de_tokens} (weights leave too little HBM)")
        self.adapter.global_queue.append(req)
        self._request_tick()

    # ------------------------------------------------------------------ scheduler fetches
    def mark_de_dirty(self, node_id: int) -> None:
        self._de_dirty.add(node_id)
        self._request_tick()

    def _request_tick(self) -> None:
        if self._tick is None:
            interval = cal.FETCH_INTERVAL_S
            t = (math.floor(self.kernel.now_s / interval) + 1) * interval
            self._tick = self.kernel.at(t, self._on_tick, PRIO_FETCH)

    def _on_tick(self) -> None:
        self._tick = None
        adapter = self.adapter
        nodes = self.cluster.nodes
        de_nodes = self.cluster.de_nodes
        if adapter.global_queue:  # phase 1 drains the global queue at the next group's fetch
            node = de_nodes[self._next_de % len(de_nodes)]
            self._next_de += 1
            self._de_dirty.discard(node.node_id)
            adapter.fetch_decode(node)
        for node_id in sorted(self._de_dirty):
            if adapter.private[node_id] and adapter.decode_may_assign(nodes[node_id]):
                adapter.fetch_decode(nodes[node_id])
        self._de_dirty.clear()
        # Groups fetch on their own timers; rotating who goes first each tick stands in for that.
        self._next_pe = (self._next_pe + 1) % len(self._pe_orders)
        if not adapter.prefill_queue:  # every PE group's fetch would be skipped
            return
        pe_dirty = self._pe_dirty
        if self._pe_all_dirty:
            pe_dirty.update(self._pe_node_ids)
            self._pe_all_dirty = False
        for node in self._pe_orders[self._next_pe]:
            if not adapter.prefill_queue:
                break  # the rest stay dirty, as if visited with nothing to fetch
            if node.node_id in pe_dirty:
                pe_dirty.discard(node.node_id)
                if not adapter.prefill_may_assign(node):
                    continue
                while (adapter.fetch_prefill(nodes[node.node_id]) >= VIEW_LIMIT
                       and adapter.prefill_queue and adapter.prefill_may_assign(node)):
                    pass  # the plan took the whole prefix: continue with the next one

    # ------------------------------------------------------------------ plan execution
    def assign_de(self, req: Req, gpu_id: int) -> None:
        st = self.de_states[gpu_id]
        req.de_gpu = gpu_id
        req.t_de = self.kernel.now_s
        st.seq += 1
        st.tok += req.decode_len
        st.reserved += req.decode_len
        self.de_node_tok[st.node_id] = self.de_node_tok[st.node_id] + req.decode_len
        self.adapter.de_changed(st.node_id, st.gpu_id)
        self.adapter.enqueue_prefill(req, st.node_id)
        self._pe_all_dirty = True  # a new request in the prefill queue: every PE group may fetch

    def assign_pe(self, req: Req, gpu_id: int, pe_read_len: int, de_read_len: int,
                  side: str) -> None:
        st = self.pe_states[gpu_id]
        req.pe_gpu = gpu_id
        req.t_pe = self.kernel.now_s
        req.pe_read_len, req.de_read_len, req.read_side = pe_read_len, de_read_len, side
        assert pe_read_len + de_read_len == req.hit_len, (req.rid, pe_read_len, de_read_len)
        st.seq += 1
        st.tok += req.prompt_len
        self.adapter.pe_changed(st.node_id, st.gpu_id)
        st.queue.append(req)
        self.metrics.hit_tokens += req.hit_len
        if self.free_io:
            req.t_alloc = req.t_read = self.kernel.now_s
            self._ready(req)
            return
        # Hit KV read on either side lands in that node's DRAM buffer (gated by its room; DE-side
        # reads leave DE_OUTPUT_RESERVE of the DE buffer to prefill output, so it always drains).
        # The prefill output's DE-buffer room is taken when the request enters a PE batch.
        req.claims_left = (pe_read_len > 0) + (de_read_len > 0)
        if req.claims_left == 0:
            req.t_alloc = req.t_read = self.kernel.now_s
            self._ready(req)
            return
        if de_read_len > 0:
            de_node = self.cluster.nodes[self.de_states[req.de_gpu].node_id]
            self.storage.claim(de_node, req, de_read_len * self.bpt, de_read_len, self._claim_done,
                               limit_frac=1.0 - cal.DE_OUTPUT_RESERVE)
        if pe_read_len > 0:
            if not self.layerwise and cal.BASIC_READS_NEED_HBM:
                st.hbm_gate.append(req)  # Basic: the read waits for PE HBM room (see calibration)
                self._pump_hbm(st)
            else:
                self._claim_pe_read(st, req)

    def _pump_hbm(self, st: PeState) -> None:
        """Start Basic's PE reads in FIFO order while the PE's HBM holds their whole prompts
        (one is always admitted into an empty HBM); the room is held until prefill is done."""
        while st.hbm_gate:
            req = st.hbm_gate[0]
            if st.hbm_used and st.hbm_used + req.prompt_len > self.pe_kv_tokens:
                return
            st.hbm_gate.popleft()
            st.hbm_used += req.prompt_len
            req.hbm_held = True
            self._claim_pe_read(st, req)

    def _claim_pe_read(self, st: PeState, req: Req) -> None:
        """Queue ``req``'s PE-side hit read for buffer room on the PE's node (then read it)."""
        self.storage.claim(self.cluster.nodes[st.node_id], req, req.pe_read_len * self.bpt,
                           req.pe_read_len, self._claim_done)

    def _claim_done(self, req: Req) -> None:
        req.claims_left -= 1
        if req.claims_left == 0:
            req.t_read = self.kernel.now_s
            self._ready(req)

    def claim_output(self, req: Req) -> bool:
        """Room in the DE buffer for the KV the PE will send (PE-read hits + misses)."""
        if self.free_io:
            return True
        node = self.cluster.nodes[self.de_states[req.de_gpu].node_id]
        return self.storage.try_reserve(node, (req.prompt_len - req.de_read_len) * self.bpt)

    def unclaim_output(self, req: Req) -> None:
        if not self.free_io:
            node = self.cluster.nodes[self.de_states[req.de_gpu].node_id]
            self.storage.release(node, (req.prompt_len - req.de_read_len) * self.bpt)

    def _ready(self, req: Req) -> None:
        req.is_ready = True
        st = self.pe_states[req.pe_gpu]
        st.num_ready += 1
        st.unit.kick()

    # ------------------------------------------------------------------ completions
    def prefill_done(self, req: Req, st: PeState, kv_at: float) -> None:
        """Last chunk computed: first token now; KV complete in the DE buffer at ``kv_at``."""
        now = self.kernel.now_s
        req.t_first = now
        st.seq -= 1
        st.tok -= req.prompt_len
        if req.hbm_held:
            st.hbm_used -= req.prompt_len
            req.hbm_held = False
            self._pump_hbm(st)
        self.adapter.pe_changed(st.node_id, st.gpu_id)
        self._pe_dirty.add(st.node_id)
        if self.adapter.prefill_queue:
            self._request_tick()
        de = self.de_states[req.de_gpu]
        if self.free_io:
            de.unit.join(req, de)
            return
        if req.pe_read_len:
            self.storage.release(self.cluster.nodes[st.node_id], req.pe_read_len * self.bpt)
        gpu = self.cluster.gpus[req.de_gpu]
        node = self.cluster.nodes[de.node_id]
        end = transfer3(node.dram, gpu.tx, gpu.rx, req.prompt_len * self.bpt, kv_at)
        self.kernel.call_at(end, lambda: self._to_hbm(req, de, node), PRIO_COMPLETE)

    def _to_hbm(self, req: Req, de: DeState, node: Node) -> None:
        self.storage.release(node, req.prompt_len * self.bpt)
        if self.starved_units:
            units, self.starved_units = self.starved_units, set()
            for unit in units:
                unit.kick()
        new_blocks = req.prompt_len // self.block_len - req.hit_len // self.block_len
        self.storage.write(node, new_blocks * self.block_len * self.bpt)
        de.unit.join(req, de)

    def decode_done(self, req: Req, de: DeState) -> None:
        now = self.kernel.now_s
        req.t_done = now
        if math.isnan(req.t_join):
            req.t_join = now
        de.seq -= 1
        de.tok -= req.decode_len
        de.reserved -= req.decode_len
        self.de_node_tok[de.node_id] = self.de_node_tok[de.node_id] - req.decode_len
        self.adapter.de_changed(de.node_id, de.gpu_id)
        if not self.free_io:
            blocks = (req.decode_len // self.block_len) - (req.prompt_len // self.block_len)
            self.storage.write(self.cluster.nodes[de.node_id], blocks * self.block_len * self.bpt)
        self.metrics.request_done(req, de.unit.current_step_s())
        self.mark_de_dirty(de.node_id)
        self._issue(req.agent)  # zero tool latency: the next turn arrives now

    # ------------------------------------------------------------------ run
    def run(self) -> dict:
        self.start()
        self.kernel.run(until_s=self.config.max_sim_s)
        for unit in self.decode_units:  # model traffic of the last stretch of each batch
            unit.flush_all()
        return self.metrics.finish()
