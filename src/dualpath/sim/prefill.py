"""Prefill engines: iterations of compute-quota batches, with layerwise KV load or Basic's.

A prefill *unit* is a set of PE GPUs that iterate in lockstep (an EP group with attention DP: the
GPUs synchronise before every MoE stage, so a layer takes the slowest GPU's attention + other time;
one GPU for DP models). Each GPU's batch comes from ``dualpath.policy`` via the adapter.

Layerwise (spec section 4): per layer, the hit KV of the batch streams into PE HBM from the PE buffer
(steps 3-4, CNIC loopback) or from the DE buffer over RDMA (DE path steps 3-5), overlapped with
compute; the layer's KV streams to the DE buffer (PE path: hit + miss, steps 5-7; DE path: miss
only). The iteration ends at max(compute, transfers + one layer of pipeline fill).
Basic: the whole prompt KV of the batch must sit in PE HBM (batch limited by free HBM), is loaded
before compute, and is sent to the DE buffer after it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from dualpath.sim.kernel import PRIO_COMPLETE
from dualpath.sim.links import transfer3

if TYPE_CHECKING:
    from dualpath.sim.driver import Simulation
    from dualpath.sim.request import Req

# Attention balance "early in the run" (the paper's 1.06): the first iterations, when every PE is
# saturated by the agents' first turns.
EARLY_ITERATIONS: Final = 100


class PeState:
    __slots__ = ("gpu_id", "node_id", "tok", "seq", "queue", "unit", "num_ready", "hbm_gate", "hbm_used")

    unit: PrefillUnit  # the PrefillUnit it iterates in (set by the unit)

    def __init__(self, gpu_id: int, node_id: int) -> None:
        self.gpu_id = gpu_id
        self.node_id = node_id
        self.tok = 0
        self.seq = 0
        self.queue: list[Req] = []  # assigned, prefill unfinished, in assignment order
        self.hbm_gate: deque[Req] = deque()  # Basic: requests whose PE read waits for HBM room
        self.hbm_used = 0  # Basic: prompt tokens of KV held in this PE's HBM
        self.num_ready = 0  # requests in ``queue`` whose reads are done (is_ready)


class PrefillUnit:
    def __init__(self, sim: Simulation, states: list[PeState]) -> None:
        self.sim = sim
        self.kernel = sim.kernel
        self.states = states
        for st in states:
            st.unit = self
        self.busy = False
        self.iterations = 0
        self.busy_s = 0.0
        self.attn_ratio_sum = 0.0
        self.attn_ratio_n = 0
        self.attn_early_sum = 0.0

    def kick(self) -> None:
        """A request became ready on one of this unit's GPUs: start iterating if idle."""
        if not self.busy:
            self.busy = True
            self.kernel.call_at(self.kernel.now_s, self._iterate)

    def _iterate(self) -> None:
        sim = self.sim
        costs = sim.costs
        batches: list[tuple[PeState, list[tuple[Req, int, int]]]] = []
        attn: list[float] = []
        layer_s = 0.0
        adapter = sim.adapter
        for st in self.states:
            if not st.num_ready:  # nothing ready: the batch view would be empty
                continue
            entries = adapter.plan_batch(st)
            if not entries:
                continue
            a = costs.attention_layer_s([(c, n) for _r, c, n in entries])
            o = costs.other_layer_s(sum(n for _r, _c, n in entries))
            attn.append(a)
            layer_s = max(layer_s, a + o)
            batches.append((st, entries))
        if not batches:
            self.busy = False
            return
        if len(attn) > 1 and sum(attn) > 0:
            ratio = max(attn) * len(attn) / sum(attn)
            self.attn_ratio_sum += ratio
            self.attn_ratio_n += 1
            if self.attn_ratio_n <= EARLY_ITERATIONS:
                self.attn_early_sum += ratio
        now = self.kernel.now_s
        compute_s = costs.iteration_s(layer_s)
        if sim.free_io:
            end = now + compute_s
            kv_at = end
        elif sim.layerwise:
            xfer_end = self._transfers(batches, now, True)
            end = max(now + compute_s, xfer_end + compute_s / costs.num_layers)
            kv_at = end
        else:
            load_end = self._transfers(batches, now, False)
            end = max(now, load_end) + compute_s
            kv_at = -1.0  # sends start after compute (see _finish)
        self.iterations += 1
        self.busy_s += end - now
        self.kernel.call_at(end, lambda: self._finish(batches, kv_at), PRIO_COMPLETE)

    def _transfers(self, batches: list[tuple[PeState, list[tuple[Req, int, int]]]], now: float,
                   with_sends: bool) -> float:
        """Reserve loads (and, layerwise, sends) of every entry; return when the last ends."""
        sim = self.sim
        gpus = sim.cluster.gpus
        nodes = sim.cluster.nodes
        bpt = sim.bpt
        last = now
        for st, entries in batches:
            pe_gpu = gpus[st.gpu_id]
            pe_node = nodes[st.node_id]
            tokens = sum(n for _r, _c, n in entries)
            pe_gpu.tx.preempt(sim.costs.pe_model_bytes(tokens), now)
            pe_gpu.rx.preempt(sim.costs.pe_model_bytes(tokens), now)
            for req, cached, chunk in entries:
                de_gpu = gpus[req.de_gpu]
                de_node = nodes[de_gpu.node_id]
                pe_part = min(cached, req.pe_read_len)
                de_part = cached - pe_part
                if pe_part:
                    last = max(last, transfer3(pe_node.dram, pe_gpu.tx, pe_gpu.rx,
                                               pe_part * bpt, now))
                if de_part:
                    last = max(last, transfer3(de_node.dram, de_gpu.tx, pe_gpu.rx,
                                               de_part * bpt, now))
                if with_sends:
                    send = chunk + (req.pe_read_len if req.done_new == 0 else 0)
                    last = max(last, transfer3(pe_gpu.tx, de_gpu.rx, de_node.dram,
                                               send * bpt, now))
        return last

    def _finish(self, batches: list[tuple[PeState, list[tuple[Req, int, int]]]],
                kv_at: float) -> None:
        sim = self.sim
        now = self.kernel.now_s
        gpus = sim.cluster.gpus
        nodes = sim.cluster.nodes
        for st, entries in batches:
            pe_gpu = gpus[st.gpu_id]
            for req, _cached, chunk in entries:
                send_at = kv_at
                if kv_at < 0:  # Basic: send this chunk's KV (and PE-read hits) after compute
                    de_gpu = gpus[req.de_gpu]
                    send = chunk + (req.pe_read_len if req.done_new == 0 else 0)
                    send_at = transfer3(pe_gpu.tx, de_gpu.rx, nodes[de_gpu.node_id].dram,
                                        send * sim.bpt, now)
                req.done_new += chunk
                if req.done_new >= req.miss_len:
                    st.queue.remove(req)
                    st.num_ready -= 1
                    sim.prefill_done(req, st, max(send_at, now))
        self._iterate()
