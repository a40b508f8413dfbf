"""The planner's event-driven run of one allocation, on the simulator's kernel and links.

One finite run (docs/planner.md, "The model"): every request arrives, waits for **decode admission** (FIFO,
limited by the free KV capacity of the pool that hosts decode attention and by the decode slots,
``max_decode_batch`` per replica of every pool running a decode stage: the one explicit queue; the
KV of the whole final context is reserved, so nothing is ever evicted), is prefilled, hands its KV
to the decode pool over N2N (PD, PDAF: layer by layer, overlapped with the prefill; PA keeps only
the current layer), decodes with continuous batching and completes.

- **Prefill iteration**: each lane of the prefill unit takes waiting prompts FIFO up to
  ``prefill_token_budget`` tokens (a longer prompt runs alone; no chunked prefill); all lanes run
  at once and the iteration ends with the slowest.
- **Decode step**: one step advances every admitted, handed-over sequence by one token, summed in
  closed form between changes of the batch (run_decode.py).
- A unit hosting both phases (ND, AF) runs prefill first, one iteration at a time, decode waiting
  (``nd_schedule`` ``prefill-first``), or mixes decode tokens and prefill chunks in each iteration
  under the token budget (``token-budget``, run_mixed.py). PD and PDAF run their prefill and decode
  units concurrently.

Throughput is (input + output tokens) / makespan of the whole run. The invariants of section 5 are
checked at the end of every run (invariants.check_invariants); a broken one raises
``SimulationError``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from dualpath.cost.stages import kv_cache_bytes
from dualpath.planner.invariants import RunConfig, RunResult, check_invariants
from dualpath.planner.links import n2n_bytes_per_s, n2n_link, n2n_transfer
from dualpath.planner.parallel import cached_work
from dualpath.planner.pools import Allocation, IterTime, PoolTimer, UnitTimer
from dualpath.planner.run_decode import DecodeSegments
from dualpath.planner.run_mixed import MixedIterations
from dualpath.sim.kernel import PRIO_ARRIVAL, PRIO_COMPLETE, Kernel
from dualpath.sim.links import Link

if TYPE_CHECKING:
    from dualpath.cost.efficiency import Efficiency
    from dualpath.planner.modes import ModeSpec
    from dualpath.planner.workloads import Requests
    from dualpath.spec.models import ModelSpec


class _Run(DecodeSegments, MixedIterations):
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
        self._init_units(efficiency)
        self._init_capacity()
        self._init_links()
        self._init_state()

    def _init_units(self, efficiency: Efficiency) -> None:
        """The timers of every unit, and which runs prefill and which decode."""
        model, mode, alloc, cfg = self.model, self.mode, self.alloc, self.cfg
        timers = {p.name: PoolTimer(model, p, efficiency, cfg.d2d_gbs) for p in alloc.pools}
        self.units = {
            u.name: UnitTimer(
                model,
                u,
                timers,
                microbatches=cfg.af_microbatches,
                n2n_gbs=cfg.n2n_gbs,
                latency_s=cfg.link_latency_s,
                af_prefill=cfg.af_prefill,
            )
            for u in mode.units
        }
        self.pre = next(u for u in self.units.values() if "prefill" in u.unit.phases)
        self.dec = next(u for u in self.units.values() if "decode" in u.unit.phases)

    def _init_capacity(self) -> None:
        """The admission limits: the free KV capacity, the decode slots and each request's KV."""
        model, mode, alloc, reqs, cfg = self.model, self.mode, self.alloc, self.reqs, self.cfg
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
        total = [i + o for i, o in zip(reqs.input_len, reqs.output_len, strict=True)]
        self.kv_req = [kv_cache_bytes(model, c, self.kv_bits) for c in total]

    def _init_links(self) -> None:
        """The busy time of each pool, the KV hand-off bandwidth and the A/F link pairs."""
        mode, alloc, cfg = self.mode, self.alloc, self.cfg
        self.busy = {p.name: 0.0 for p in alloc.pools}
        self.links: list[Link] = []  # the A/F links; the KV links are made as replicas use them
        self.kv_links: dict[int, Link] = {}  # prefill replica -> its hand-off link
        self.has_kv_boundary = mode.kv_boundary is not None
        self.kv_bw = 0.0
        if mode.kv_boundary is not None:
            src, dst = (alloc.pool(x) for x in mode.kv_boundary)
            self.kv_devices = (src.layout.replica_devices, dst.layout.replica_devices)
            self.kv_bw = n2n_bytes_per_s(*self.kv_devices, cfg.n2n_gbs)
        self.af_links: dict[str, tuple[Link, Link]] = {}
        for name, u in self.units.items():
            if u.unit.is_split:
                pair = (Link(f"{name}_a2f", "n2n", u.bw), Link(f"{name}_f2a", "n2n", u.bw))
                self.af_links[name] = pair
                self.links += list(pair)

    def _init_state(self) -> None:
        """Empty queues and decode state for every request."""
        n = len(self.reqs)
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
        self.seg = None
        self.mixed = self.cfg.nd_schedule == "token-budget" and self.pre is self.dec
        self.prefilled: dict[int, int] = {}  # token-budget: prompt tokens prefilled so far
        self.done_s = [math.nan] * n
        self.num_done = 0

    # ---- admission and prefill ---------------------------------------------------------------
    def run(self, until_s: float = math.inf) -> RunResult | None:
        for t in self.reqs.arrival_s:
            self.k.call_at(t, self._arrive, PRIO_ARRIVAL)
        self.k.run(until_s)
        if self.num_done < len(self.reqs) and self.k.pending:
            return None  # stopped at until_s with requests left: it cannot finish by then
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
            if self.mixed:
                self._start_mixed()
            else:
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
        if self.has_kv_boundary:
            layers = self.model.num_layers
            p = unit.a.plan.layout.pp
            for i, lane in enumerate(lanes):
                nbytes = sum(self._handoff_bytes(r) for r in lane)
                link = self._kv_link(i // p)
                arrive = n2n_transfer(link, nbytes, now + it.time_s / layers, self.cfg.link_latency_s)
                done = max(arrive, end + nbytes / layers / self.kv_bw)
                self.k.call_at(done, _bind(self._join, lane), PRIO_COMPLETE)
            self.k.call_at(end, self._prefill_done_split, PRIO_COMPLETE)
        else:
            flat = [r for lane in lanes for r in lane]
            self.k.call_at(end, _bind(self._prefill_done_local, flat), PRIO_COMPLETE)

    def _kv_link(self, replica: int) -> Link:
        """The hand-off link of prefill replica ``replica`` (made on first use: a pool of
        thousands of replicas touches few of them in one run)."""
        link = self.kv_links.get(replica)
        if link is None:
            a, b = self.kv_devices
            link = self.kv_links[replica] = n2n_link(f"kv{replica}", a, b, self.cfg.n2n_gbs)
        return link

    def all_links(self) -> list[Link]:
        """Every N2N link the run used: the A/F links and the KV links made so far."""
        return self.links + list(self.kv_links.values())

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


def makespan_lower_bound(
    model: ModelSpec,
    mode: ModeSpec,
    alloc: Allocation,
    reqs: Requests,
    cfg: RunConfig,
    efficiency: Efficiency,
) -> float:
    """A makespan no run of ``alloc`` can beat: every request decodes its O tokens one step at a
    time after it arrives, and no step is faster than the decode unit's at batch 1 and the
    shortest context (step times only grow with the batch and the context); and every pool
    hosting a prefill stage does all its prompts' FLOPs at no more than its devices' peak."""
    timers = {p.name: PoolTimer(model, p, efficiency, cfg.d2d_gbs) for p in alloc.pools}
    unit = next(u for u in mode.units if "decode" in u.phases)
    dec = UnitTimer(
        model,
        unit,
        timers,
        microbatches=cfg.af_microbatches,
        n2n_gbs=cfg.n2n_gbs,
        latency_s=cfg.link_latency_s,
        af_prefill=cfg.af_prefill,
    )
    t1 = dec.decode(1, float(min(reqs.input_len))).time_s
    bound = max(a + o * t1 for a, o in zip(reqs.arrival_s, reqs.output_len, strict=True))
    for pool in alloc.pools:
        for stage in (s for s in pool.stages if s in ("pa", "pf")):
            bits = pool.bits_map[stage]
            flops = sum(cached_work(model, stage, 1, n, bits).flops for n in reqs.input_len)
            peak = pool.num_devices * pool.device.device.peak_flops(bits)
            bound = max(bound, reqs.arrival_s[0] + flops / peak)
    return bound


def simulate(
    model: ModelSpec,
    mode: ModeSpec,
    alloc: Allocation,
    reqs: Requests,
    cfg: RunConfig,
    efficiency: Efficiency,
    *,
    until_s: float = math.inf,
) -> RunResult | None:
    """Run ``alloc`` (a deployment of ``mode``) on ``reqs``; invariants checked at the end. With
    ``until_s`` the run stops at that simulated time and returns None when requests are left (its
    makespan would exceed ``until_s``: the search passes the mode's best makespan so far, which a
    stopped run cannot beat, since every allocation serves the same tokens)."""
    return _Run(model, mode, alloc, reqs, cfg, efficiency).run(until_s)
