"""Prefill engines: iterations of compute-quota batches; the KV load is the run's load path.

A prefill *unit* is a set of PE GPUs that iterate in lockstep (an EP group with attention DP: the
GPUs synchronise before every MoE stage, so a layer takes the slowest GPU's attention + other time;
one GPU for DP models). Each GPU's batch comes from ``dualpath.policy`` (``plan_batch``, the
adapter's). How the batch's KV moves, and so when the iteration ends and when each chunk's KV is in
the DE buffer, is the load path's (``sim/load_path.py``: layerwise, Basic's whole prompt, free).
A unit's collaborators are narrow: the kernel, the cost cache, the batch planner, the load path's
two timing methods and the driver's ``on_done``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from dualpath.sim.kernel import PRIO_COMPLETE, Kernel

if TYPE_CHECKING:
    from dualpath.sim.costs import CostCache
    from dualpath.sim.decode import CpuShare
    from dualpath.sim.request import Req


class PeState:
    __slots__ = ("gpu_id", "node_id", "tok", "seq", "queue", "unit", "num_ready")

    unit: PrefillUnit  # the PrefillUnit it iterates in (set by the unit)

    def __init__(self, gpu_id: int, node_id: int) -> None:
        self.gpu_id = gpu_id
        self.node_id = node_id
        self.tok = 0
        self.seq = 0
        self.queue: list[Req] = []  # assigned, prefill unfinished, in assignment order
        self.num_ready = 0  # requests in ``queue`` whose reads are done (is_ready)


Entries = list[tuple["Req", int, int]]  # (request, cached_len, chunk_len) of one GPU's batch


class PrefillTiming(Protocol):
    """What a unit needs of the load path (``LoadPath`` satisfies it)."""

    def iteration_end(
        self, batches: list[tuple[PeState, Entries]], now: float, compute_s: float
    ) -> tuple[float, float]: ...

    def chunk_sent_at(self, st: PeState, req: Req, chunk: int, now: float, kv_at: float) -> float: ...


class PrefillUnit:
    def __init__(
        self,
        states: list[PeState],
        *,
        kernel: Kernel,
        costs: CostCache,
        load: PrefillTiming,
        plan_batch: Callable[[PeState], Entries],
        on_done: Callable[[Req, PeState, float], None],
        on_boundary: Callable[[PrefillUnit], None] | None = None,
    ) -> None:
        """``plan_batch(st)``: the GPU's next batch (may be empty); ``on_done(req, st, kv_at)``:
        ``req``'s last chunk is computed and its KV complete in the DE buffer at ``kv_at``;
        ``on_boundary(unit)``: an iteration ended, before the next batch forms (its groups'
        fetch, when PE groups fetch between iterations)."""
        self.kernel = kernel
        self.costs = costs
        self.load = load
        self.plan_batch = plan_batch
        self.on_done = on_done
        self.on_boundary = on_boundary
        self.states = states
        for st in states:
            st.unit = self
        self.busy = False
        self.iter_end = 0.0  # when the running iteration ends (while ``busy``)
        self.share: CpuShare | None = None  # the cores it shares (the local cluster), else None
        self.computing = False  # whether an iteration runs (counted in ``share``)
        self.cpu_s = 0.0  # (with ``share``) the seconds its iterations computed, slowdown aside
        self.attn_ratio_sum = 0.0
        self.attn_ratio_n = 0
        # for multi-GPU units, every iteration's start time and per-GPU attention layer time (0.0
        # for a GPU without a batch), len(states) values an iteration: sim/metrics.py reads the
        # early window from them (the iterations that start before the first 5% of the run's
        # requests had their first token), as per-GPU totals and as per-iteration max/avg
        self.iter_t = array("d")
        self.attn_gpu = array("d")

    def next_boundary_s(self, t: float) -> float:
        """When this unit next sits between iterations at or after ``t`` (``t`` if idle)."""
        return self.iter_end if self.busy and self.iter_end > t else t

    def kick(self) -> None:
        """A request became ready on one of this unit's GPUs: start iterating if idle."""
        if not self.busy:
            self.busy = True
            self.kernel.call_at(self.kernel.now_s, self._iterate)

    def _iterate(self) -> None:
        costs = self.costs
        batches: list[tuple[PeState, Entries]] = []
        attn: list[float] = []
        layer_s = 0.0
        plan_batch = self.plan_batch
        per_gpu = [0.0] * len(self.states)
        for i, st in enumerate(self.states):
            if not st.num_ready:  # nothing ready: the batch view would be empty
                continue
            entries = plan_batch(st)
            if not entries:
                continue
            spans: list[tuple[int, int]] = []
            tokens = 0
            for _r, c, n in entries:
                spans.append((c, n))
                tokens += n
            a = costs.attention_layer_s(spans)
            o = costs.other_layer_s(tokens)
            attn.append(a)
            per_gpu[i] = a
            if a + o > layer_s:
                layer_s = a + o
            batches.append((st, entries))
        share = self.share
        if not batches:
            self.busy = False
            if share is not None and self.computing:
                self.computing = False
                share.change(-1)
            return
        if len(per_gpu) > 1:
            self.iter_t.append(self.kernel.now_s)
            self.attn_gpu.extend(per_gpu)
        if len(attn) > 1 and sum(attn) > 0:
            ratio = max(attn) * len(attn) / sum(attn)
            self.attn_ratio_sum += ratio
            self.attn_ratio_n += 1
        now = self.kernel.now_s
        compute_s = costs.iteration_s(layer_s)
        if share is not None:
            if not self.computing:
                self.computing = True
                share.change(1)
            self.cpu_s += compute_s
            compute_s *= share.slowdown()
        end, kv_at = self.load.iteration_end(batches, now, compute_s)
        self.iter_end = end
        self.kernel.call_at(end, lambda: self._finish(batches, kv_at), PRIO_COMPLETE)

    def _finish(self, batches: list[tuple[PeState, Entries]], kv_at: float) -> None:
        now = self.kernel.now_s
        load = self.load
        for st, entries in batches:
            for req, _cached, chunk in entries:
                send_at = load.chunk_sent_at(st, req, chunk, now, kv_at)
                req.done_new += chunk
                if req.done_new >= req.miss_len:
                    st.queue.remove(req)
                    st.num_ready -= 1
                    self.on_done(req, st, send_at if send_at > now else now)
        if self.on_boundary is not None:
            self.on_boundary(self)
        self._iterate()
