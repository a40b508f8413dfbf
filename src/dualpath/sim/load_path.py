"""How a system moves KV (spec sections 4 and 9): one strategy object per run, from the SystemSpec.

The scheduler decides who prefills and decodes and which side reads the hit KV (``dualpath.policy``);
a *load path* is the mechanism that carries those decisions out, and the one thing the systems
differ in besides their policy:

- :class:`LayerwiseLoad` (every system but Basic and Oracle): hit KV is read from storage into the
  reading side's DRAM buffer; per layer it streams into PE HBM (PE side: CNIC loopback; DE side:
  the DE buffer over RDMA) while the PE computes, and each layer's KV streams to the DE buffer
  (PE path: hit + miss; DE path: miss only). An iteration ends at max(compute, transfers + one
  layer of pipeline fill).
- :class:`WholePromptLoad` (Basic): the same reads, but a batch's whole prompt KV must sit in PE
  HBM (the batch view is cut at the PE's KV room), is loaded before compute and sent to the DE
  buffer after it.
- :class:`FreeIO` (Oracle): reads, host-device copies and PD transfers cost nothing and put no byte
  on any link (asserted at the end of the run); compute is the same.
- :class:`ReadFreeLoad` (the local cluster's Oracle, ``sim/local.py``): reads and PD transfers
  free, persists paid, the DE's step-boundary wait and admission kept (the runtime's ``read_free``).

After prefill the KV goes DE buffer -> DE HBM, and decode persists the new full blocks to storage
(except under FreeIO). Every path calls the driver's ``ready(req)`` when a request's reads are in
DRAM, and ``join`` on the DE unit once its KV is in DE HBM. The strategies decide nothing.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, ClassVar

from dualpath.core.registry import lookup
from dualpath.sim.kernel import PRIO_COMPLETE, Kernel
from dualpath.sim.links import transfer3

if TYPE_CHECKING:
    from dualpath.sim.cluster import Cluster, Node
    from dualpath.sim.costs import CostCache
    from dualpath.sim.decode import DeState
    from dualpath.sim.prefill import PeState, PrefillUnit
    from dualpath.sim.request import Req
    from dualpath.sim.storage import Storage

Batches = list[tuple["PeState", list[tuple["Req", int, int]]]]


class LoadPath:
    """The KV movement shared by the real paths: storage reads into DRAM buffers, the DE-buffer
    room for prefill output, DE buffer -> DE HBM, decode persistence. Subclasses give the
    iteration timing. ``moves_kv``: False for FreeIO and ReadFreeLoad (no storage reads, no PD
    transfers); ``pays_persists``: False only for FreeIO; ``whole_prompt_in_hbm``: Basic's
    batch-view cut (read by the adapter)."""

    moves_kv: ClassVar[bool] = True
    pays_persists: ClassVar[bool] = True
    whole_prompt_in_hbm: ClassVar[bool] = False

    def __init__(
        self,
        *,
        kernel: Kernel,
        cluster: Cluster,
        storage: Storage,
        costs: CostCache,
        block_len: int,
        de_output_reserve: float,
        ready: Callable[[Req], None],
        read_done: Callable[[Req, int | None], None],
        starved: set[PrefillUnit],
    ) -> None:
        self.kernel = kernel
        self.nodes: list[Node] = cluster.nodes
        self.gpus = cluster.gpus
        self.storage = storage
        self.costs = costs
        self.bpt: int = cluster.kv_bytes_per_token
        self.block_len = block_len
        self.de_read_limit = 1.0 - de_output_reserve  # DE-side reads leave the output's share
        self.ready = ready
        self.read_done = read_done  # one side's read is in DRAM: (req, that node; None = no read)
        self.starved = starved  # PE units that skipped a request for lack of DE buffer room
        # EP all-to-all bytes per token of a decode step (none without link costs)
        self.de_model_bytes_per_token: float = costs.de_model_bytes(1) if self.moves_kv else 0.0

    # ------------------------------------------------------------------ reads (PE assigned)
    def start_reads(self, req: Req, pe_node_id: int) -> None:
        """Queue ``req``'s hit reads (each side's into that node's DRAM buffer, gated by its
        room); ``ready(req)`` once all are in DRAM. The prefill output's DE-buffer room is taken
        when the request enters a PE batch (:meth:`claim_output`)."""
        pe_read_len, de_read_len = req.pe_read_len, req.de_read_len
        req.claims_left = (pe_read_len > 0) + (de_read_len > 0)
        if req.claims_left == 0:
            req.t_alloc = req.t_read = self.kernel.now_s
            self.ready(req)
            return
        bpt = self.bpt
        if de_read_len > 0:
            de_node = self.nodes[self.gpus[req.de_gpu].node_id]
            self.storage.claim(
                de_node,
                req,
                de_read_len * bpt,
                de_read_len,
                self._de_read_done,
                limit_frac=self.de_read_limit,
            )
        if pe_read_len > 0:
            self.storage.claim(
                self.nodes[pe_node_id], req, pe_read_len * bpt, pe_read_len, self._pe_read_done
            )

    def start_reads_at(self, req: Req, pe_node_id: int, pe_at: float, de_at: float) -> None:
        """The local cluster's order (``sim/local.py``): each engine takes its task between its
        steps, the PE at ``pe_at``, the DE at ``de_at``, and starts its side's reads then; the
        request is ready once the PE has taken it and every read is in DRAM."""
        req.claims_left = 1 + (req.de_read_len > 0)  # the PE's taking (with its reads), the DE's reads
        kernel = self.kernel
        if req.de_read_len > 0:
            kernel.call_at(de_at, partial(self._local_de_claim, req), PRIO_COMPLETE)
        kernel.call_at(pe_at, partial(self._local_pe_claim, req, pe_node_id), PRIO_COMPLETE)

    def _local_pe_claim(self, req: Req, pe_node_id: int) -> None:
        if req.pe_read_len > 0:
            self.storage.claim(
                self.nodes[pe_node_id], req, req.pe_read_len * self.bpt, req.pe_read_len, self._pe_read_done
            )
            return
        if req.de_read_len == 0:
            req.t_alloc = self.kernel.now_s
        self._claim_done(req)

    def _local_de_claim(self, req: Req) -> None:
        de_node = self.nodes[self.gpus[req.de_gpu].node_id]
        bpt = self.bpt
        self.storage.claim(
            de_node,
            req,
            req.de_read_len * bpt,
            req.de_read_len,
            self._de_read_done,
            limit_frac=self.de_read_limit,
        )

    def _de_read_done(self, req: Req) -> None:
        self.read_done(req, self.gpus[req.de_gpu].node_id)
        self._claim_done(req)

    def _pe_read_done(self, req: Req) -> None:
        self.read_done(req, self.gpus[req.pe_gpu].node_id)
        self._claim_done(req)

    def _claim_done(self, req: Req) -> None:
        req.claims_left -= 1
        if req.claims_left == 0:
            req.t_read = self.kernel.now_s
            self.ready(req)

    def claim_output(self, req: Req) -> bool:
        """Take room in the DE buffer for the KV the PE will send (PE-read hits + misses)."""
        node = self.nodes[self.gpus[req.de_gpu].node_id]
        return self.storage.try_reserve(node, (req.prompt_len - req.de_read_len) * self.bpt)

    def unclaim_output(self, req: Req) -> None:
        node = self.nodes[self.gpus[req.de_gpu].node_id]
        self.storage.release(node, (req.prompt_len - req.de_read_len) * self.bpt)

    # ------------------------------------------------------------------ PE iterations
    @abstractmethod
    def iteration_end(self, batches: Batches, now: float, compute_s: float) -> tuple[float, float]:
        """``(end, kv_at)`` of a PE iteration starting ``now`` with ``compute_s`` of compute:
        ``kv_at`` is when every chunk's KV is in the DE buffer, or -1 when the sends start only
        after compute (then :meth:`chunk_sent_at` gives each one)."""

    def chunk_sent_at(self, st: PeState, req: Req, chunk: int, now: float, kv_at: float) -> float:
        """When ``req``'s ``chunk`` (just computed, ``req.done_new`` not yet advanced) is in the
        DE buffer."""
        return kv_at

    def _transfers(self, batches: Batches, now: float, with_sends: bool) -> float:
        """Reserve the loads (and, ``with_sends``, the sends) of every entry, plus the PE's EP
        all-to-all; return when the last ends."""
        gpus = self.gpus
        nodes = self.nodes
        bpt = self.bpt
        costs = self.costs
        last = now
        for st, entries in batches:
            pe_gpu = gpus[st.gpu_id]
            pe_node = nodes[st.node_id]
            tokens = 0
            for _r, _c, n in entries:
                tokens += n
            model_bytes = costs.pe_model_bytes(tokens)
            pe_gpu.tx.preempt(model_bytes, now)
            pe_gpu.rx.preempt(model_bytes, now)
            for req, cached, chunk in entries:
                de_gpu = gpus[req.de_gpu]
                de_node = nodes[de_gpu.node_id]
                pe_part = min(cached, req.pe_read_len)
                de_part = cached - pe_part
                if pe_part:
                    t = transfer3(pe_node.dram, pe_gpu.tx, pe_gpu.rx, pe_part * bpt, now)
                    if t > last:
                        last = t
                if de_part:
                    t = transfer3(de_node.dram, de_gpu.tx, pe_gpu.rx, de_part * bpt, now)
                    if t > last:
                        last = t
                if with_sends:
                    send = chunk + (req.pe_read_len if req.done_new == 0 else 0)
                    t = transfer3(pe_gpu.tx, de_gpu.rx, de_node.dram, send * bpt, now)
                    if t > last:
                        last = t
        return last

    # ------------------------------------------------------------------ after prefill / decode
    def deliver(self, req: Req, pe_node_id: int, de: DeState, kv_at: float) -> None:
        """Prefill done and its KV complete in the DE buffer at ``kv_at``: free the PE-side read
        room, move the KV to DE HBM (DRAM -> CNIC loopback), then free the DE buffer, persist the
        prompt's new full blocks and join the decode batch."""
        bpt = self.bpt
        if req.pe_read_len:
            self.storage.release(self.nodes[pe_node_id], req.pe_read_len * bpt)
        gpu = self.gpus[req.de_gpu]
        node = self.nodes[de.node_id]
        # the PD hand-off (sim/calibration.py); the DE engine sees it at its next step boundary
        # (its scheduling loop runs between decode steps) and only then posts the copy. The copy
        # is booked on the links from the hand-off (booking it later would leave the FIFO links
        # idle in front of it) and its end is moved by that wait.
        start = kv_at + self.costs.pd_handoff_s
        wait = de.unit.next_boundary_s(start) - start
        end = transfer3(node.dram, gpu.tx, gpu.rx, req.prompt_len * bpt, start) + wait
        self.kernel.call_at(end, lambda: self._to_hbm(req, de, node), PRIO_COMPLETE)

    def _to_hbm(self, req: Req, de: DeState, node: Node) -> None:
        self.storage.release(node, req.prompt_len * self.bpt)
        if self.starved:
            units = list(self.starved)
            self.starved.clear()
            for unit in units:
                unit.kick()
        new_blocks = req.prompt_len // self.block_len - req.hit_len // self.block_len
        self.storage.write(node, new_blocks * self.block_len * self.bpt)
        de.unit.join(req, de, req.prompt_len)

    def persist_decode(self, req: Req, de: DeState) -> float:
        """Decode finished: write the full blocks it completed (DRAM -> SNIC -> storage); returns
        when every persist its DE node booked so far is done."""
        block_len = self.block_len
        blocks = (req.decode_len // block_len) - (req.prompt_len // block_len)
        return self.storage.write(self.nodes[de.node_id], blocks * block_len * self.bpt)


class LayerwiseLoad(LoadPath):
    """Per-layer loads and sends overlapped with compute (spec section 4)."""

    def iteration_end(self, batches: Batches, now: float, compute_s: float) -> tuple[float, float]:
        costs = self.costs
        xfer_end = self._transfers(batches, now, True)
        # + every layer's load/send completion hand-off (sim/calibration.py PD_LAYER_HANDOFF_S)
        compute_end = now + compute_s
        load_end = xfer_end + compute_s / costs.num_layers
        end = (compute_end if compute_end > load_end else load_end) + costs.layer_handoff_s
        return end, end


class WholePromptLoad(LoadPath):
    """Basic: the batch's whole prompt KV in PE HBM, loaded before compute, sent after it."""

    whole_prompt_in_hbm: ClassVar[bool] = True

    def iteration_end(self, batches: Batches, now: float, compute_s: float) -> tuple[float, float]:
        load_end = self._transfers(batches, now, False)
        return (load_end if load_end > now else now) + compute_s, -1.0

    def chunk_sent_at(self, st: PeState, req: Req, chunk: int, now: float, kv_at: float) -> float:
        de_gpu = self.gpus[req.de_gpu]
        send = chunk + (req.pe_read_len if req.done_new == 0 else 0)
        return transfer3(
            self.gpus[st.gpu_id].tx, de_gpu.rx, self.nodes[de_gpu.node_id].dram, send * self.bpt, now
        )


class FreeIO(LoadPath):
    """Oracle: no reads, copies or transfers (nor EP model traffic on links); compute only."""

    moves_kv: ClassVar[bool] = False
    pays_persists: ClassVar[bool] = False

    def start_reads(self, req: Req, pe_node_id: int) -> None:
        req.t_alloc = req.t_read = self.kernel.now_s
        self.read_done(req, None)  # free reads: done at once
        self.ready(req)

    def claim_output(self, req: Req) -> bool:
        return True

    def unclaim_output(self, req: Req) -> None:
        pass

    def iteration_end(self, batches: Batches, now: float, compute_s: float) -> tuple[float, float]:
        end = now + compute_s
        return end, end

    def deliver(self, req: Req, pe_node_id: int, de: DeState, kv_at: float) -> None:
        de.unit.join(req, de)

    def persist_decode(self, req: Req, de: DeState) -> float:
        return self.kernel.now_s


class ReadFreeLoad(LoadPath):
    """The local cluster's Oracle (the runtime's ``TrafficConfig.read_free``): storage reads and
    PD transfers cost nothing and book no link, the DE still takes a finished prefill at its
    next step boundary (and pays its measured admission), and persists are paid as usual."""

    moves_kv: ClassVar[bool] = False

    def start_reads(self, req: Req, pe_node_id: int) -> None:
        req.t_alloc = req.t_read = self.kernel.now_s
        self.read_done(req, None)
        self.ready(req)

    def start_reads_at(self, req: Req, pe_node_id: int, pe_at: float, de_at: float) -> None:
        req.claims_left = 1 + (req.de_read_len > 0)
        if req.de_read_len > 0:
            self.kernel.call_at(de_at, partial(self._free_read, req), PRIO_COMPLETE)
        self.kernel.call_at(pe_at, partial(self._free_read, req), PRIO_COMPLETE)

    def _free_read(self, req: Req) -> None:
        if req.claims_left == 1 + (req.de_read_len > 0):
            req.t_alloc = self.kernel.now_s
        if req.claims_left == 1:
            self.read_done(req, None)  # free reads: done once both engines took the request
        self._claim_done(req)

    def claim_output(self, req: Req) -> bool:
        return True

    def unclaim_output(self, req: Req) -> None:
        pass

    def iteration_end(self, batches: Batches, now: float, compute_s: float) -> tuple[float, float]:
        end = now + compute_s
        return end, end

    def deliver(self, req: Req, pe_node_id: int, de: DeState, kv_at: float) -> None:
        start = kv_at + self.costs.pd_handoff_s
        end = de.unit.next_boundary_s(start)
        self.kernel.call_at(end, lambda: self._free_to_hbm(req, de), PRIO_COMPLETE)

    def _free_to_hbm(self, req: Req, de: DeState) -> None:
        node = self.nodes[de.node_id]
        new_blocks = req.prompt_len // self.block_len - req.hit_len // self.block_len
        self.storage.write(node, new_blocks * self.block_len * self.bpt)
        de.unit.join(req, de, req.prompt_len)


LOAD_PATHS: dict[str, type[LoadPath]] = {
    "layerwise": LayerwiseLoad,
    "whole-prompt": WholePromptLoad,
    "free-io": FreeIO,
    "read-free": ReadFreeLoad,
}


def load_path_class(name: str) -> type[LoadPath]:
    """The strategy named by ``SystemSpec.load_path`` (ConfigError naming the choices if none)."""
    return lookup(LOAD_PATHS, name, "load path")
