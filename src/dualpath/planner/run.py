"""The planner's event-driven run of one allocation, on the simulator's kernel and links.

One finite run (issue 11 section 5): every request arrives, waits for **decode admission** (FIFO,
limited by the free KV capacity of the pool that hosts decode attention and by the decode slots,
``max_decode_batch`` per replica of every pool running a decode stage: the one explicit queue; the
KV of the whole final context is reserved, so nothing is ever evicted), is prefilled, hands its KV
to the decode pool over N2N (PD, PDAF: layer by layer, overlapped with the prefill; PA keeps only
the current layer), decodes with continuous batching and completes.

- **Prefill iteration**: each lane of the prefill unit takes waiting prompts FIFO up to
  ``prefill_token_budget`` tokens (a longer prompt runs alone; no chunked prefill); all lanes run
  at once and the iteration ends with the slowest.
- **Decode step**: one step advances every admitted, handed-over sequence by one token. Its time is
  the closed form of the unit (pools.UnitTimer: stage rooflines, TP/EP collectives, AF round
  trips; no per-layer events). Steps between two changes of the batch (a join, a completion, a
  prefill that preempts) are summed in closed form as one event (``_cum``: the work is linear in
  the growing context between grid points ``parallel.DECODE_CTX_GRID`` tokens apart, so each grid
  cell sums as a trapezoid); an event that changes the batch cuts the segment at the end of the
  step in progress.
- A unit hosting both phases (ND, AF) runs prefill first, one iteration at a time; decode waits.
  PD and PDAF run their prefill and decode units concurrently.

Throughput is (input + output tokens) / makespan of the whole run. The invariants of section 5 are
checked at the end of every run (invariants.check_invariants); a broken one raises
``SimulationError``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dualpath.cost.stages import kv_cache_bytes
from dualpath.planner.invariants import RunConfig, RunResult, check_invariants
from dualpath.planner.links import n2n_bytes_per_s, n2n_link, n2n_transfer
from dualpath.planner.parallel import DECODE_CTX_GRID
from dualpath.planner.pools import Allocation, IterTime, PoolTimer, UnitTimer
from dualpath.sim.kernel import PRIO_ARRIVAL, PRIO_COMPLETE, Handle, Kernel
from dualpath.sim.links import Link

if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.planner.modes import ModeSpec
    from dualpath.planner.workloads import Requests
    from dualpath.spec.models import ModelSpec


@dataclass(slots=True)
class _Segment:
    start_s: float
    step0: int
    steps: int
    batch: int
    ctx_sum: float
    handle: Handle
    sums: tuple[float, float, float] = (0.0, 0.0, 0.0)
    memo: dict[int, IterTime] = field(default_factory=dict)


class _Run:
    def __init__(
        self,
        model: ModelSpec,
        mode: ModeSpec,
        alloc: Allocation,
        reqs: Requests,
        cfg: RunConfig,
        efficiency: Efficiency,
    ) -> None:
        self.model, self.mode, self.alloc, self.reqs, self.cfg = model, mode, alloc, reqs, cfg
        self.k = Kernel()
        timers = {p.name: PoolTimer(model, p, efficiency, cfg.d2d_gbs) for p in alloc.pools}
        self.units = {
            u.name: UnitTimer(
                model,
                u,
                timers,
                microbatches=cfg.af_microbatches,
                n2n_gbs=cfg.n2n_gbs,
                latency_s=cfg.link_latency_s,
            )
            for u in mode.units
        }
        self.pre = next(u for u in self.units.values() if "prefill" in u.unit.phases)
        self.dec = next(u for u in self.units.values() if "decode" in u.unit.phases)
        kv_pool = alloc.pool(mode.kv_pool.name)
        self.kv_bits = kv_pool.bits_map["da"]
        self.kv_cap = (
            max(kv_pool.device.device.capacity_bytes - kv_pool.weights_per_device(model), 0.0)
            * kv_pool.num_devices
        )
        # a decode iteration of any replica batches at most max_decode_batch sequences: the F side
        # of a split serves every A lane's sequences, so its replicas bound the batch too
        self.slots = cfg.max_decode_batch * min(
            p.layout.dp for p in alloc.pools if any(s in ("da", "df") for s in p.stages)
        )
        n = len(reqs)
        total = [i + o for i, o in zip(reqs.input_len, reqs.output_len, strict=True)]
        self.kv_req = [kv_cache_bytes(model, c, self.kv_bits) for c in total]
        self.busy = {p.name: 0.0 for p in alloc.pools}
        self.links: list[Link] = []
        self.kv_links: list[Link] = []
        self.kv_bw = 0.0
        if mode.kv_boundary is not None:
            src, dst = (alloc.pool(x) for x in mode.kv_boundary)
            a, b = src.layout.replica_devices, dst.layout.replica_devices
            self.kv_links = [n2n_link(f"kv{r}", a, b, cfg.n2n_gbs) for r in range(src.layout.dp)]
            self.kv_bw = n2n_bytes_per_s(a, b, cfg.n2n_gbs)
            self.links += self.kv_links
        self.af_links: dict[str, tuple[Link, Link]] = {}
        for name, u in self.units.items():
            if u.unit.is_split:
                pair = (Link(f"{name}_a2f", "n2n", u.bw), Link(f"{name}_f2a", "n2n", u.bw))
                self.af_links[name] = pair
                self.links += list(pair)
        self.admit_q: deque[int] = deque(range(n))
        self.arrived = 0
        self.prefill_q: deque[int] = deque()
        self.kv_used = self.max_kv = 0.0
        self.num_admitted = 0
        self.busy_unit: dict[str, bool] = {name: False for name in self.units}
        # decode state: batch size, sum of (input - join step), steps done, finish heap
        self.batch = 0
        self.ctx_sum = 0.0
        self.step = 0
        self.finish: list[tuple[int, int]] = []
        self.join_step = [0] * n
        self.pending: list[int] = []
        self.seg: _Segment | None = None
        self.done_s = [math.nan] * n
        self.num_done = 0

    # ---- admission and prefill ---------------------------------------------------------------
    def run(self) -> RunResult:
        for t in self.reqs.arrival_s:
            self.k.call_at(t, self._arrive, PRIO_ARRIVAL)
        self.k.run()
        return self._check()

    def _arrive(self) -> None:
        self.arrived += 1
        self._admit()

    def _admit(self) -> None:
        q = self.admit_q
        changed = False
        while (
            q
            and q[0] < self.arrived
            and self.num_admitted < self.slots
            and self.kv_used + self.kv_req[q[0]] <= self.kv_cap
        ):
            rid = q.popleft()
            self.kv_used += self.kv_req[rid]
            self.max_kv = max(self.max_kv, self.kv_used)
            self.num_admitted += 1
            self.prefill_q.append(rid)
            changed = True
        if changed:
            self._wake(self.pre)

    def _wake(self, unit: UnitTimer) -> None:
        name = unit.unit.name
        if not self.busy_unit[name]:
            self._next(unit)
        elif unit is self.dec and self.seg is not None:
            self._cut()

    def _next(self, unit: UnitTimer) -> None:
        self.busy_unit[unit.unit.name] = False
        if unit is self.pre and self.prefill_q:
            self._start_prefill()
        elif unit is self.dec and (self.batch or self.pending):
            self._start_decode()

    def _start_prefill(self) -> None:
        unit, budget, q = self.pre, self.cfg.prefill_token_budget, self.prefill_q
        lanes: list[list[int]] = []
        while q and len(lanes) < unit.lanes:
            lane = [q.popleft()]
            tokens = self.reqs.input_len[lane[0]]
            while q and tokens + self.reqs.input_len[q[0]] <= budget:
                tokens += self.reqs.input_len[q[0]]
                lane.append(q.popleft())
            lanes.append(lane)
        lens = [[self.reqs.input_len[r] for r in lane] for lane in lanes]
        it = unit.prefill(lens)
        now = self.k.now_s
        end = now + it.time_s
        self._account(unit, it, now, 1)
        self.busy_unit[unit.unit.name] = True
        if self.kv_links:
            layers = self.model.num_layers
            p = unit.a.plan.layout.pp
            for i, lane in enumerate(lanes):
                nbytes = sum(self._handoff_bytes(r) for r in lane)
                link = self.kv_links[i // p]
                arrive = n2n_transfer(link, nbytes, now + it.time_s / layers, self.cfg.link_latency_s)
                done = max(arrive, end + nbytes / layers / self.kv_bw)
                self.k.call_at(done, _bind(self._join, lane), PRIO_COMPLETE)
            self.k.call_at(end, self._prefill_done_split, PRIO_COMPLETE)
        else:
            flat = [r for lane in lanes for r in lane]
            self.k.call_at(end, _bind(self._prefill_done_local, flat), PRIO_COMPLETE)

    def _handoff_bytes(self, rid: int) -> float:
        return kv_cache_bytes(self.model, self.reqs.input_len[rid], self.kv_bits)

    def _prefill_done_split(self) -> None:
        self._next(self.pre)

    def _prefill_done_local(self, rids: list[int]) -> None:
        self.pending.extend(rids)
        self._next(self.pre)  # prefill first: decode resumes when the prefill queue is empty
        if self.pre is not self.dec:
            self._wake(self.dec)

    def _join(self, rids: list[int]) -> None:
        self.pending.extend(rids)
        self._wake(self.dec)

    # ---- decode segments -----------------------------------------------------------------------
    def _start_decode(self) -> None:
        for rid in self.pending:
            self.join_step[rid] = self.step
            self.batch += 1
            self.ctx_sum += self.reqs.input_len[rid] - self.step
            heapq.heappush(self.finish, (self.step + self.reqs.output_len[rid], rid))
        self.pending.clear()
        steps = self.finish[0][0] - self.step
        seg = _Segment(
            start_s=self.k.now_s,
            step0=self.step,
            steps=steps,
            batch=self.batch,
            ctx_sum=self.ctx_sum,
            handle=None,
        )  # type: ignore[arg-type]
        seg.sums = self._cum(seg, steps)
        seg.handle = self.k.at(seg.start_s + seg.sums[0], self._end_decode, PRIO_COMPLETE)
        self.seg = seg
        self.busy_unit[self.dec.unit.name] = True

    def _step_time(self, seg: _Segment, j: int) -> IterTime:
        it = seg.memo.get(j)
        if it is None:
            ctx = seg.ctx_sum / seg.batch + seg.step0 + j
            it = seg.memo[j] = self.dec.decode(seg.batch, ctx)
        return it

    def _cum(self, seg: _Segment, n: int) -> tuple[float, float, float]:
        """Sums over the segment's first ``n`` steps, piece by piece between the context grid
        points where the step time's slope may change."""
        f: Callable[[int], IterTime] = lambda j: self._step_time(seg, j)  # noqa: E731
        m = seg.ctx_sum / seg.batch + seg.step0  # mean context at the segment's step 0
        g = DECODE_CTX_GRID
        out = (0.0, 0.0, 0.0)
        a = 0
        while a < n:
            nxt = (math.floor((m + a) / g) + 1) * g  # next grid point above the context at a
            b = min(n, max(a + 1, math.ceil(nxt - m - 1e-9)))
            x = _series(f, a, b - a)
            out = (out[0] + x[0], out[1] + x[1], out[2] + x[2])
            a = b
        return out

    def _cut(self) -> None:
        """End the running segment after the step in progress (a join or a prefill waits)."""
        seg = self.seg
        assert seg is not None
        elapsed = self.k.now_s - seg.start_s
        f: Callable[[int], IterTime] = lambda j: self._step_time(seg, j)  # noqa: E731
        # the smallest n whose n steps end at or after now (steps only grow: n <= the guess)
        lo, hi = 1, min(seg.steps, int(elapsed / f(0).time_s) + 1)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._cum(seg, mid)[0] >= elapsed - 1e-12:
                hi = mid
            else:
                lo = mid + 1
        n = lo
        if n >= seg.steps:
            return
        seg.handle.cancel()
        sums = self._cum(seg, n)
        seg.steps, seg.sums = n, sums
        seg.handle = self.k.at(seg.start_s + sums[0], self._end_decode, PRIO_COMPLETE)

    def _end_decode(self) -> None:
        seg = self.seg
        assert seg is not None
        self.seg = None
        it = IterTime(
            time_s=seg.sums[0], a_busy_s=seg.sums[1], f_busy_s=seg.sums[2], fwd_bytes=0.0, bwd_bytes=0.0
        )
        self._account(self.dec, it, seg.start_s, seg.steps, decode_tokens=seg.batch)
        self.step += seg.steps
        now = self.k.now_s
        freed = False
        while self.finish and self.finish[0][0] <= self.step:
            _, rid = heapq.heappop(self.finish)
            self.batch -= 1
            self.ctx_sum -= self.reqs.input_len[rid] - self.join_step[rid]
            self.kv_used -= self.kv_req[rid]
            self.num_admitted -= 1
            self.done_s[rid] = now
            self.num_done += 1
            freed = True
        if self.batch == 0:
            self.ctx_sum = 0.0
        self.busy_unit[self.dec.unit.name] = False
        if freed:
            self._admit()
        if not self.busy_unit[self.dec.unit.name]:
            self._next(self.dec)

    # ---- accounting and invariants -------------------------------------------------------------
    def _account(
        self, unit: UnitTimer, it: IterTime, start_s: float, steps: int, decode_tokens: int = 0
    ) -> None:
        a, f = unit.a.plan.name, unit.f.plan.name
        if unit.unit.is_split:
            self.busy[a] += it.a_busy_s
            self.busy[f] += it.f_busy_s
            fwd_link, bwd_link = self.af_links[unit.unit.name]
            if decode_tokens:
                layers = self.model.num_layers
                fwd = layers * steps * decode_tokens * unit.act_a["decode"]
                bwd = layers * steps * decode_tokens * unit.act_f["decode"]
            else:
                fwd, bwd = it.fwd_bytes, it.bwd_bytes
            n2n_transfer(fwd_link, fwd, start_s)
            n2n_transfer(bwd_link, bwd, start_s)
        else:
            self.busy[a] += it.time_s

    def _check(self) -> RunResult:
        return check_invariants(self)


def _bind(fn: Callable[[list[int]], None], arg: list[int]) -> Callable[[], None]:
    return lambda: fn(arg)


def _series(f: Callable[[int], IterTime], a: int, n: int) -> tuple[float, float, float]:
    """(sum of time, A busy, F busy) of ``f(a) .. f(a + n - 1)`` over one grid cell, where the
    work is linear in the step: the trapezoid of the two ends (exact when the step time is linear;
    a compute/memory crossover inside the cell is smoothed)."""
    if n <= 0:
        return (0.0, 0.0, 0.0)
    first = f(a)
    if n == 1:
        return (first.time_s, first.a_busy_s, first.f_busy_s)
    last = f(a + n - 1)
    return (
        n * (first.time_s + last.time_s) / 2,
        n * (first.a_busy_s + last.a_busy_s) / 2,
        n * (first.f_busy_s + last.f_busy_s) / 2,
    )


def simulate(
    model: ModelSpec,
    mode: ModeSpec,
    alloc: Allocation,
    reqs: Requests,
    cfg: RunConfig,
    efficiency: Efficiency,
) -> RunResult:
    """Run ``alloc`` (a deployment of ``mode``) on ``reqs``; invariants checked at the end."""
    return _Run(model, mode, alloc, reqs, cfg, efficiency).run()
