"""The simulation driver: wires kernel, cluster, storage, engines and the policy adapter, and
carries each agent's turns through the pipeline (spec sections 3-4, 8-9):

arrival -> global queue -> DE fetch (HBM reserved) -> prefill queue -> PE fetch (PE, read side) ->
DRAM-buffer claims + storage reads -> PE iterations -> KV in DE buffer -> DE HBM -> decode -> next turn.

How the KV moves (and what it costs) is the system's load path (``sim/load_path.py``), chosen from
``SystemSpec.load_path``; the constants come from ``config.calibration``. The scheduling state is
the policy's ledger behind ``sim/adapter.py``.
"""

from __future__ import annotations

import dataclasses
import math
import random
from functools import partial

from dualpath.policy import ForwardAttentionPredictor, SchedulerConfig, make_scheduler
from dualpath.policy.batch import BatchLimits
from dualpath.policy.fetch import RUNTIME_ORDER, SIM_ORDER
from dualpath.policy.views import PrefillAssignment
from dualpath.sim.adapter import PolicyAdapter
from dualpath.sim.cluster import Cluster
from dualpath.sim.config import SimConfig
from dualpath.sim.costs import CostCache, ProfileCosts
from dualpath.sim.decode import CpuShare, DecodeUnit, DeState
from dualpath.sim.kernel import PRIO_ARRIVAL, PRIO_COMPLETE, PRIO_FETCH, Handle, Kernel
from dualpath.sim.load_path import LoadPath, load_path_class
from dualpath.sim.local import BLOCK_SIZE as LOCAL_BLOCK_SIZE
from dualpath.sim.local import MAX_BATCH_TOKENS as LOCAL_MAX_BATCH_TOKENS
from dualpath.sim.metrics import Metrics
from dualpath.sim.prefill import PeState, PrefillUnit
from dualpath.sim.request import Agent, Req
from dualpath.sim.storage import Storage

# The local cluster runs the runtime's one layerwise engine for every policy; its Oracle is
# ``TrafficConfig.read_free`` (reads and PD transfers free, persists paid)
LOCAL_LOAD_PATHS = {"layerwise": "layerwise", "whole-prompt": "layerwise", "free-io": "read-free"}


class Simulation:
    cluster: Cluster
    bpt: int
    costs: CostCache
    de_kv_tokens: int
    pe_kv_tokens: int
    local_limits: BatchLimits | None
    beta_rate: float
    cpu_cores: float
    background_threads: float

    def __init__(self, config: SimConfig, agents: list[Agent]) -> None:
        self.config = config
        self.system = config.system
        cal = config.calibration
        self.kernel = Kernel()
        self.local = local = config.profile is not None  # the local cluster (sim/local.py)
        if local:
            self._local_hardware(config)
        else:
            self._paper_hardware(config)
        cluster = self.cluster
        self.block_len: int = config.block_len
        self.storage = Storage(
            self.kernel,
            cluster.nodes,
            self.bpt,
            read_latency_s=cal.storage_read_latency_s,
            alloc_s=cal.buffer_alloc_s,
        )
        de_kv = self.de_kv_tokens
        self.max_de_tokens = de_kv
        self.pe_states = {g.gpu_id: PeState(g.gpu_id, g.node_id) for g in cluster.gpus if g.role == "pe"}
        self.de_states = {
            g.gpu_id: DeState(g.gpu_id, g.node_id, de_kv) for g in cluster.gpus if g.role == "de"
        }
        # the same, as lists by GPU id (PE GPUs are 0.., DE GPUs follow): the hot lookups
        self.pe_list: list[PeState] = [self.pe_states[g] for g in range(len(self.pe_states))]
        self.de_base: int = len(self.pe_states)
        self.de_list: list[DeState] = [self.de_states[self.de_base + i] for i in range(len(self.de_states))]
        # PE units that skipped a request for lack of DE buffer (the load path kicks them)
        self.starved_units: set[PrefillUnit] = set()
        load_name = LOCAL_LOAD_PATHS[self.system.load_path] if local else self.system.load_path
        self.load: LoadPath = load_path_class(load_name)(
            kernel=self.kernel,
            cluster=cluster,
            storage=self.storage,
            costs=self.costs,
            block_len=self.block_len,
            de_output_reserve=cal.de_output_reserve,
            ready=self._ready,
            read_done=self._read_done,
            starved=self.starved_units,
        )
        forward = ForwardAttentionPredictor(layer=self.costs.predictor, num_layers=self.costs.num_layers)
        sched_cfg = SchedulerConfig.from_rates(
            snic_bytes_per_s=cluster.nodes[0].snic.bytes_per_s,
            kv_bytes_per_token=self.bpt,
            prefill_tokens_per_s=self.beta_rate,
            attention_predictor=forward,
            block_size=self.block_len,
            compute_quota_s=cal.compute_quota_per_forward_s,
            pe_scope=config.pe_scope,
            read_tie=config.read_tie,
            pe_tie=config.pe_tie,
            **({"max_batch_tokens": LOCAL_MAX_BATCH_TOKENS} if local else {}),
        )
        # PE groups fetch between their iterations (the local cluster: the runtime's order, every
        # group on its tick; its engines take their tasks between their steps, see assign_pe)
        boundary = config.pe_fetch == "boundary" and not local
        order = RUNTIME_ORDER if local else SIM_ORDER
        self.adapter = PolicyAdapter(
            self,
            make_scheduler(self.system.policy, sched_cfg),
            engines=[(g.gpu_id, g.node_id, g.role) for g in cluster.gpus],
            read_rates={n.node_id: n.snic.bytes_per_s / self.bpt for n in cluster.nodes},
            de_hbm_tokens=de_kv,
            pe_hbm_tokens=self.pe_kv_tokens if self.load.whole_prompt_in_hbm else None,
            order=dataclasses.replace(order, interval_s=cal.fetch_interval_s, pe_fetch_at_boundary=boundary),
            batch_limits=self.local_limits,
        )
        self.fetch_interval_s = self.adapter.fetcher.order.interval_s
        self.prefill_units = [
            PrefillUnit(
                [self.pe_states[g] for g in u],
                kernel=self.kernel,
                costs=self.costs,
                load=self.load,
                plan_batch=self.adapter.plan_batch,
                on_done=self.prefill_done,
                on_boundary=self._pe_boundary if boundary else None,
            )
            for u in cluster.prefill_units
        ]
        # each unit's PE groups (nodes), and each group's units (DeepSeek: one unit spans whole
        # nodes; DP models: several engines a node); a group is mid-iteration while all its units are
        self.unit_nodes = {u: list(dict.fromkeys(st.node_id for st in u.states)) for u in self.prefill_units}
        self.pe_node_units: dict[int, list[PrefillUnit]] = {}
        for unit, nodes in self.unit_nodes.items():
            for node in nodes:
                self.pe_node_units.setdefault(node, []).append(unit)
        self.decode_units = [
            DecodeUnit(
                [self.de_states[g] for g in u],
                kernel=self.kernel,
                costs=self.costs,
                gpus=[cluster.gpus[g] for g in u],
                model_bytes_per_token=self.load.de_model_bytes_per_token,
                on_done=self.decode_done,
                first_token_at_step_end=local,
            )
            for u in cluster.decode_units
        ]
        if local:  # the engines share the profiled machine's cores (sim/local.py)
            share = CpuShare(self.cpu_cores, self.background_threads)
            share.decode_units = list(self.decode_units)
            for de_unit in self.decode_units:
                de_unit.share = share
            for pe_unit in self.prefill_units:
                pe_unit.share = share
        self.metrics = Metrics(
            config.out_dir,
            system_name=self.system.name,
            keep_latency=config.aps is not None,
            stop_ttft_s=config.ttft_stop_s,
            kernel=self.kernel,
        )
        self.agents = agents
        self.agents_left = len(agents)
        self.rng = random.Random(config.seed)
        self._tick: Handle | None = None

    def _paper_hardware(self, config: SimConfig) -> None:
        """A paper cluster (``spec.clusters.ClusterPreset``): GPUs, the cost model, HBM room."""
        cal = config.calibration
        self.cluster = cluster = Cluster(config.cluster, cal, config.snic_directions)
        model = cluster.model
        self.bpt = model.kv_bytes_per_token
        gpn = cluster.num_gpus_per_node
        pe_ep = len(cluster.prefill_units[0]) if cluster.prefill_units[0] else 1
        de_ep = len(cluster.decode_units[0]) if cluster.decode_units[0] else 1
        self.costs = CostCache(
            model,
            cluster.gpu_spec,
            name=config.cost_model,
            pe_ep_size=pe_ep,
            de_ep_size=de_ep,
            num_gpus_per_node=gpn,
            cal=cal,
            tp_size=cluster.tp_size,
            cnic_gbps=cluster.node_spec.cnic_gbps,
        )
        from dualpath.cost import weight_bytes_per_gpu

        hbm = cluster.gpu_spec.hbm_gb * 1e9 * cal.hbm_usable_fraction
        de_kv = int((hbm - weight_bytes_per_gpu(model, ep_size=de_ep)) / self.bpt)
        self.pe_kv_tokens = max(0, int((hbm - weight_bytes_per_gpu(model, ep_size=pe_ep)) / self.bpt))
        if de_kv <= 0 or hbm < weight_bytes_per_gpu(model, ep_size=pe_ep):
            from dualpath.core.errors import ConfigError

            raise ConfigError(
                "cluster",
                config.cluster.name,
                "weights do not fit in PE or DE HBM (use more nodes per EP group)",
            )
        self.de_kv_tokens = de_kv
        self.beta_rate = self._prefill_tokens_per_s()
        self.local_limits = None
        self.cpu_cores = 0.0
        self.background_threads = 0.0

    def _local_hardware(self, config: SimConfig) -> None:
        """The local cluster (``sim/local.py``): one engine per node, the profile's step times,
        the runtime's KV pools (a DE's paged cache is what its scheduler books it for; a PE reports
        one staging slot per layer's batch to its batch planner) and beta rate."""
        from dualpath.sim import local

        profile, spec = config.profile, config.cluster
        assert profile is not None and isinstance(spec, local.LocalClusterSpec)  # (SimConfig checks)
        pe_pools, de_pools = spec.kv_pools(profile)
        self.cluster = Cluster(spec, config.calibration, spec.snic_directions, (pe_pools, de_pools))
        self.bpt = profile.kv_bytes_per_token
        self.costs = ProfileCosts(profile, config.calibration)
        self.de_kv_tokens = de_pools.max_context_tokens
        self.local_limits = BatchLimits(staging_tokens=pe_pools.staging_tokens, block_size=LOCAL_BLOCK_SIZE)
        self.pe_kv_tokens = 0
        self.cpu_cores = spec.cpu_cores if spec.cpu_cores is not None else float(profile.cpu_cores)
        self.background_threads = spec.background_threads
        self.beta_rate = local.PREFILL_TOKENS_PER_S

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

            raise ConfigError(
                "cluster",
                self.config.cluster.name,
                f"a request needs {req.decode_len} tokens of DE HBM but a DE holds "
                f"at most {self.max_de_tokens} "
                + (
                    "(its paged cache: a larger kv_cache_bytes)"
                    if self.local
                    else "(weights leave too little HBM)"
                ),
            )
        self.adapter.arrive(req)
        self._request_tick()

    # ------------------------------------------------------------------ scheduler fetches
    def now(self) -> float:
        return self.kernel.now_s

    def request_tick(self) -> None:
        """Fetch at the next multiple of the fetch interval (once, however often asked)."""
        self._request_tick()

    def _request_tick(self) -> None:
        if self._tick is None:
            interval = self.fetch_interval_s
            t = (math.floor(self.kernel.now_s / interval) + 1) * interval
            self._tick = self.kernel.at(t, self._on_tick, PRIO_FETCH)

    def _on_tick(self) -> None:
        self._tick = None
        self.adapter.tick(self.pe_group_busy)

    def pe_group_busy(self, node_id: int) -> bool:
        """Whether every PE unit of group ``node_id`` is mid-iteration."""
        return all(u.busy for u in self.pe_node_units[node_id])

    def _pe_boundary(self, unit: PrefillUnit) -> None:
        """``unit``'s iteration ended: its groups fetch before its next batch forms."""
        self.adapter.fetch_at_boundary(self.unit_nodes[unit])

    def starved(self, st: PeState) -> None:
        """PE ``st`` skipped a request for lack of DE buffer room: kick its unit when some frees."""
        self.starved_units.add(st.unit)

    # ------------------------------------------------------------------ plan execution
    def assign_de(self, req: Req, gpu_id: int) -> None:
        req.de_gpu = gpu_id
        req.t_de = self.kernel.now_s

    def assign_pe(self, req: Req, a: PrefillAssignment) -> None:
        st = self.pe_list[a.engine_id]
        pe_read_len, de_read_len = a.pe_read_len, a.de_read_len
        req.pe_gpu = a.engine_id
        req.t_pe = self.kernel.now_s
        req.pe_read_len, req.de_read_len, req.read_side = pe_read_len, de_read_len, a.read_side
        st.queue.append(req)
        self.metrics.hit_tokens += req.hit_len
        if self.local:  # each engine takes its task between its steps (sim/local.py)
            now = self.kernel.now_s
            de_unit = self.de_list[req.de_gpu - self.de_base].unit
            self.load.start_reads_at(
                req, st.node_id, st.unit.next_boundary_s(now), de_unit.next_boundary_s(now)
            )
        else:
            self.load.start_reads(req, st.node_id)

    def _read_done(self, req: Req, node_id: int | None) -> None:
        """One side's hit read of ``req`` is in DRAM (``node_id`` None: free I/O, no read)."""
        self.adapter.read_done(req, node_id)

    def claim_output(self, req: Req) -> bool:
        """Room in the DE buffer for the KV the PE will send (PE-read hits + misses)."""
        return self.load.claim_output(req)

    def unclaim_output(self, req: Req) -> None:
        self.load.unclaim_output(req)

    def _ready(self, req: Req) -> None:
        req.is_ready = True
        st = self.pe_list[req.pe_gpu]
        st.num_ready += 1
        st.unit.kick()

    # ------------------------------------------------------------------ completions
    def prefill_done(self, req: Req, st: PeState, kv_at: float) -> None:
        """Last chunk computed: first token now; KV complete in the DE buffer at ``kv_at``."""
        now = self.kernel.now_s
        req.t_first = now
        self.adapter.prefill_done(req)
        if self.adapter.ledger.prefill_queue:
            self._request_tick()
        self.load.deliver(req, st.node_id, self.de_list[req.de_gpu - self.de_base], kv_at)

    def decode_done(self, req: Req, de: DeState) -> None:
        now = self.kernel.now_s
        req.t_done = now
        if math.isnan(req.t_join):
            req.t_join = now
        persisted = self.load.persist_decode(req, de)
        step_s = de.unit.current_step_s()
        if self.local and persisted > now:  # the last token waits for the DE's persists
            self.kernel.call_at(persisted, partial(self._complete, req, step_s), PRIO_COMPLETE)
            return
        self._complete(req, step_s)

    def _complete(self, req: Req, step_s: float) -> None:
        """``req``'s last token reached its client: it is done, its agent's next turn arrives."""
        req.t_done = self.kernel.now_s
        self.adapter.finished(req)
        self.metrics.request_done(req, step_s)
        self._request_tick()  # its DE group may fetch again
        self._issue(req.agent)  # zero tool latency: the next turn arrives now

    # ------------------------------------------------------------------ run
    def run(self) -> dict:
        self.start()
        self.kernel.run(until_s=self.config.max_sim_s)
        for unit in self.decode_units:  # model traffic of the last stretch of each batch
            unit.flush_all()
        return self.metrics.finish(self)
