"""Decode engines: every request in the forward batch, advanced analytically between changes.

A decode *unit* is a set of DE GPUs that step in lockstep (one EP group; one GPU for DP models).
Its step time is the slowest GPU's (``CostCache.decode_step_s`` of that GPU's batch), constant
between batch changes. The unit keeps a step counter that advances continuously with time, whole
numbers at step boundaries; a request joining at counter ``c`` enters the batch at the next
boundary ``ceil(c)`` (continuous batching admits between steps; an idle unit starts at once) and
produces its last token at counter ``ceil(c) + gen_len - 1`` (its first token came from prefill).
So the only events are joins and the next finish: no per-token events. A join stalls the unit
(``CostCache.join_stall_s``); the GPUs step in lockstep, so in one step the unit waits for the GPU
with the most stall, not for the sum over GPUs.
Context growth during a turn's decode (at most a few hundred tokens on tens of thousands) is folded
in by counting each request at its mid-decode context.

EP models: every decode step sends each GPU's batch through the MoE all-to-all on its CNIC's
high-priority lane (``CostCache.de_model_bytes``, both directions), so KV transfers to and from a DE
only get the idle rest. The bytes of the steps a GPU ran with an unchanged batch are put on its
links when that batch changes (and at the end of the run), starting where that stretch began.

A unit's collaborators are narrow: the kernel, the cost cache, its GPUs' links, the all-to-all bytes
per token (0 without link costs: the load path says) and the driver's ``on_done``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from dualpath.sim.kernel import PRIO_COMPLETE, Handle, Kernel

if TYPE_CHECKING:
    from dualpath.sim.cluster import Gpu
    from dualpath.sim.costs import CostCache
    from dualpath.sim.request import Req


class DeState:
    """One DE: ``tok``/``seq`` as the scheduler sees them (assigned, unfinished), HBM reservation,
    and the running batch of its unit's forward pass."""

    __slots__ = (
        "gpu_id",
        "node_id",
        "unit",
        "tok",
        "seq",
        "hbm_tokens",
        "reserved",
        "batch",
        "ctx_sum",
        "step_s",
        "slot",
        "model_mark",
        "model_t",
        "touched",
        "stall_step",
        "stall_acc",
        "model_credit",
    )

    unit: DecodeUnit  # the DecodeUnit it steps in (set by the unit)

    def __init__(self, gpu_id: int, node_id: int, hbm_tokens: int) -> None:
        self.gpu_id = gpu_id
        self.node_id = node_id
        self.tok = 0
        self.seq = 0
        self.hbm_tokens = hbm_tokens
        self.reserved = 0
        self.batch = 0
        self.ctx_sum = 0.0
        self.step_s = 0.0
        self.slot = 0
        self.model_mark = 0.0  # unit step counter when this GPU's model traffic was last put on links
        self.model_t = 0.0  # ... and the time
        self.touched = False  # a finish in the unit's current ``_on_finish`` removed one of its requests
        self.stall_step = -1  # the unit step in which this GPU's join stalls were last charged ...
        self.stall_acc = 0.0  # ... and their sum in that step
        self.model_credit = 0.0  # request-steps since the mark that joiners spent before their boundary


class CpuShare:
    """The cores the local cluster's engines share (sim/local.py): while ``computing`` engines
    run a step beside ``background`` runnable threads of other work, each runs at
    ``min(1, cores / (computing + background))`` of its own speed (processor sharing, as the
    kernel's fair scheduler gives runnable threads equal shares). Decode units are re-timed
    whenever the count changes; a PE iteration takes the share at its start."""

    def __init__(self, cores: float, background: float = 0.0) -> None:
        self.cores = float(cores)
        self.background = background
        self.computing = 0
        self.decode_units: list[DecodeUnit] = []

    def slowdown(self) -> float:
        """How much longer a step takes than on an engine of its own."""
        demand = self.computing + self.background
        return demand / self.cores if demand > self.cores else 1.0

    def change(self, delta: int) -> None:
        self.computing += delta
        for unit in self.decode_units:
            unit.retime()


class DecodeUnit:
    def __init__(
        self,
        states: list[DeState],
        *,
        kernel: Kernel,
        costs: CostCache,
        gpus: list[Gpu],
        model_bytes_per_token: float,
        on_done: Callable[[Req, DeState], None],
        first_token_at_step_end: bool = False,
    ) -> None:
        """``gpus``: the engines of ``states``, in order; ``on_done(req, st)``: ``req`` produced
        its last token on ``st``. ``first_token_at_step_end``: a joining request's first token
        counts (``req.t_first``) at the end of its first step, when an engine that sends a step's
        tokens after the step hands it out (the local cluster's DE, sim/local.py)."""
        self.kernel = kernel
        self.costs = costs
        self.on_done = on_done
        self.states = states
        for slot, st in enumerate(states):
            st.unit = self
            st.slot = slot
        self.step_list = [0.0] * len(states)
        self.max_step = 0.0  # max(step_list), kept up to date by _set_step
        self.counter = 0.0
        self.last_t = 0.0
        self.step_s = 0.0
        self.heap: list[tuple[float, int, Req, DeState]] = []  # (target, seq, req, its DE)
        self.seq = 0
        self.handle: Handle | None = None
        self.stall_step = -1  # the step of the largest per-GPU join stall charged so far ...
        self.stall_max = 0.0  # ... and that stall (lockstep: a step waits for its slowest GPU)
        # EP all-to-all bytes per token per step; none for DP models and for Oracle (no link costs)
        self.model_bytes_per_token = model_bytes_per_token
        self.gpus = gpus
        self.first_token_at_step_end = first_token_at_step_end
        self.share: CpuShare | None = None  # the cores it shares (the local cluster), else None
        self.computing = False  # whether it holds a running batch (counted in ``share``)
        self.cpu_s = 0.0  # (with ``share``) the seconds its steps computed, their slowdown aside

    def _advance(self) -> None:
        now = self.kernel.now_s
        if self.step_s > 0.0 and self.heap:
            self.counter += (now - self.last_t) / self.step_s
            if self.share is not None:  # the engine's own compute (its slowdown aside)
                self.cpu_s += (now - self.last_t) * self.max_step / self.step_s
        self.last_t = now

    def _set_step(self, st: DeState, step_s: float) -> None:
        """Set one GPU's step time; the unit's max is recomputed only if the max went down."""
        old = self.step_list[st.slot]
        self.step_list[st.slot] = st.step_s = step_s
        if step_s >= self.max_step:
            self.max_step = step_s
        elif old == self.max_step:
            self.max_step = max(self.step_list)

    def flush_model_traffic(self, st: DeState) -> None:
        """Put ``st``'s all-to-all bytes of the steps since its last flush on its CNIC (tx and rx,
        high priority) -- call after ``_advance`` and before its batch changes."""
        steps = self.counter - st.model_mark
        if st.batch and steps > 0 and self.model_bytes_per_token:
            nbytes = (steps * st.batch - st.model_credit) * self.model_bytes_per_token
            gpu = self.gpus[st.slot]
            gpu.tx.preempt(nbytes, st.model_t)
            gpu.rx.preempt(nbytes, st.model_t)
        st.model_mark = self.counter
        st.model_t = self.kernel.now_s
        st.model_credit = 0.0

    def flush_all(self) -> None:
        """End of run: every GPU's outstanding model traffic."""
        self._advance()
        for st in self.states:
            self.flush_model_traffic(st)

    def retime(self) -> None:
        """The unit's share of the cores changed: its steps from now take the new time."""
        if self.heap:
            self._advance()
            self._restep()

    def _computing(self, on: bool) -> None:
        share = self.share
        if share is not None and on != self.computing:
            self.computing = on
            share.change(1 if on else -1)

    def _restep(self) -> None:
        share = self.share
        self.step_s = self.max_step if share is None else self.max_step * share.slowdown()
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if self.heap:
            wait = (self.heap[0][0] - self.counter) * self.step_s
            self.handle = self.kernel.at(self.kernel.now_s + max(wait, 0.0), self._on_finish, PRIO_COMPLETE)

    def join(self, req: Req, st: DeState, copied_tokens: int = 0) -> None:
        """``req``'s KV is in ``st``'s HBM (``copied_tokens`` of it just copied from the DE
        buffer): add it to the running batch."""
        self._advance()
        steps = req.gen_len - 1
        if steps <= 0:
            self.on_done(req, st)
            return
        self.flush_model_traffic(st)
        running = bool(self.heap)
        if running:  # the join stalls the running batch (CostCache.join_stall_s) ...
            k = int(self.counter)
            if st.stall_step != k:
                st.stall_step = k
                st.stall_acc = 0.0
            if self.stall_step != k:
                self.stall_step = k
                self.stall_max = 0.0
            st.stall_acc = st.stall_acc + self.costs.join_stall_s(copied_tokens)
            extra = st.stall_acc - self.stall_max
            if extra > 0.0:  # ... but stalls of other GPUs in the same step overlap with it
                self.stall_max = st.stall_acc
                self.counter -= extra / self.step_s
        # a running batch admits requests at its next step boundary (an integer counter); an
        # idle unit starts a step now
        if running:
            start = float(math.ceil(self.counter - 1e-9))
        else:
            start = self.counter = float(math.ceil(self.counter - 1e-9))
        req.target = start + steps
        self.seq += 1
        heapq.heappush(self.heap, (req.target, self.seq, req, st))
        st.batch += 1
        st.ctx_sum += req.prompt_len + req.gen_len / 2
        st.model_credit = start - st.model_mark  # it sends nothing before its first step
        self._set_step(st, self.costs.decode_step_s(st.batch, st.ctx_sum))
        if self.share is not None:
            self._computing(True)
        self._restep()
        req.t_join = self.kernel.now_s + (start - self.counter) * self.step_s
        if self.first_token_at_step_end:
            req.t_first = req.t_join + self.step_s

    def _on_finish(self) -> None:
        self.handle = None
        self._advance()
        heap = self.heap
        limit = self.counter + 1e-6
        touched: list[DeState] = []  # in first-finish order (``st.touched`` marks membership)
        while heap and heap[0][0] <= limit:
            _t, _s, req, st = heapq.heappop(heap)
            if not st.touched:
                st.touched = True
                touched.append(st)
                self.flush_model_traffic(st)
            st.batch -= 1
            st.ctx_sum -= req.prompt_len + req.gen_len / 2
            self.on_done(req, st)
        for st in touched:
            st.touched = False
            self._set_step(st, self.costs.decode_step_s(st.batch, st.ctx_sum) if st.batch else 0.0)
            if not st.batch:
                st.ctx_sum = 0.0
        if self.share is not None and not heap:
            self._computing(False)
        self._restep()

    def next_boundary_s(self, t: float) -> float:
        """The first step boundary at or after time ``t`` (>= now) at the current step time: when
        the engine's scheduling loop next runs and sees what arrived by ``t``; ``t`` if idle."""
        if not self.heap or self.step_s <= 0.0:
            return t
        c_t = self.counter + (t - self.last_t) / self.step_s
        return t + (math.ceil(c_t - 1e-9) - c_t) * self.step_s

    def current_step_s(self) -> float:
        return self.step_s
