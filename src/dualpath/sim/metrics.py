"""Per-request records (streamed to disk), run summaries and the end-of-run invariants.

Memory stays bounded for offline runs: each finished request is written as one CSV row (when an
output folder is given) and folded into running sums; only online runs keep per-request latency
arrays (for percentiles), which are short because online runs are short. Online runs also stop
early (``Kernel.stop``) once the mean TTFT of the last ``STOP_WINDOW`` requests exceeds
``stop_ttft_s`` (the paper's stopping rule); ``stopped_reason`` says so.
"""

from __future__ import annotations

import math
import os
from array import array
from typing import IO, TYPE_CHECKING, Final, Protocol

from dualpath.sim.links import check_utilisation

if TYPE_CHECKING:
    from dualpath.sim.cluster import Cluster
    from dualpath.sim.config import SimConfig
    from dualpath.sim.costs import CostCache
    from dualpath.sim.decode import DecodeUnit
    from dualpath.sim.kernel import Kernel
    from dualpath.sim.load_path import LoadPath
    from dualpath.sim.prefill import PrefillUnit
    from dualpath.sim.request import Agent, Req
    from dualpath.sim.storage import Storage

FIELDS = (
    "rid",
    "agent",
    "turn",
    "prompt_len",
    "hit_len",
    "gen_len",
    "de_gpu",
    "pe_gpu",
    "read_side",
    "t_arrive",
    "t_de",
    "t_pe",
    "t_alloc",
    "t_read",
    "t_first",
    "t_join",
    "t_done",
)
# TTFT breakdown in the paper's four categories (its figure 12), each the time a request spends in
# that state; they tile arrival -> first token, so they sum to TTFT (sim/request.py says which
# timestamps bound each).
BREAKDOWN = ("scheduling", "allocation", "reading", "prefill")
# "Early in the run" for the attention balance: iterations that start before the first 5% of the
# run's requests (agent turns) have their first token.
EARLY_FRACTION: Final = 0.05
STOP_WINDOW: Final = 1000  # requests in the online stopping rule's mean TTFT


class RunState(Protocol):
    """What :meth:`Metrics.finish` reads of a finished run (``Simulation`` has all of it)."""

    config: SimConfig
    kernel: Kernel
    cluster: Cluster
    storage: Storage
    load: LoadPath
    prefill_units: list[PrefillUnit]
    decode_units: list[DecodeUnit]
    costs: CostCache
    agents: list[Agent]
    agents_left: int
    bpt: int


class Metrics:
    def __init__(
        self,
        out_dir: str | None,
        *,
        system_name: str,
        keep_latency: bool,
        stop_ttft_s: float | None,
        kernel: Kernel,
    ) -> None:
        """``keep_latency``: keep per-request arrays (online runs); ``stop_ttft_s``: the stopping
        rule's SLO (None: never stop); ``kernel`` is stopped when the rule fires."""
        self.kernel = kernel
        self.system_name = system_name
        self.stopped_reason = ""
        self.num_requests = 0
        self.hit_tokens = 0
        # running sums (floats, added in request order) and counts; see the sums/counts properties
        self._ttft_sum = 0.0
        self._ttst_sum = 0.0
        self._tpot_sum = 0.0
        self._scheduling_sum = 0.0
        self._allocation_sum = 0.0
        self._reading_sum = 0.0
        self._prefill_sum = 0.0
        self._ttft_n = 0
        self._ttst_n = 0  # = the tpot count
        self.keep = keep_latency
        self.ttft = array("d")
        self.ttst = array("d")
        self.tpot = array("d")
        self.t_arrive = array("d")
        self._window: list[float] = []
        self._window_sum = 0.0
        self.stop_ttft_s: float | None = stop_ttft_s
        self.agent_jct = array("d")
        self.t_first = array("d")  # every finished request's first-token time (the early window)
        self._file: IO[str] | None = None
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            path = os.path.join(out_dir, f"requests_{system_name}.csv")
            self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed in finish)
            self._file.write(",".join(FIELDS) + "\n")

    def request_done(self, req: Req, step_s: float) -> None:
        self.num_requests += 1
        ttft = req.t_first - req.t_arrive
        self._ttft_sum += ttft
        self._scheduling_sum += req.t_pe - req.t_arrive
        self._allocation_sum += req.t_alloc - req.t_pe
        self._reading_sum += req.t_read - req.t_alloc
        self._prefill_sum += req.t_first - req.t_read
        self._ttft_n += 1
        self.t_first.append(req.t_first)
        ttst = tpot = math.nan
        if req.gen_len > 1:
            ttst = req.t_join + step_s - req.t_first  # first -> second token (the paper's TTST)
            tpot = (req.t_done - req.t_first) / (req.gen_len - 1)
            self._ttst_sum += ttst
            self._tpot_sum += tpot
            self._ttst_n += 1
        if self.keep:
            self.ttst.append(ttst)
            self.tpot.append(tpot)
            self.ttft.append(ttft)
            self.t_arrive.append(req.t_arrive)
            if self.stop_ttft_s is not None:
                self._stop_rule(ttft)
        if self._file is not None:
            self._file.write(
                ",".join(_fmt(getattr(req, f)) if f != "agent" else str(req.agent.index) for f in FIELDS)
                + "\n"
            )

    @property
    def sums(self) -> dict[str, float]:
        """Running sums of ``ttft``, ``ttst``, ``tpot`` and the TTFT breakdown (seconds)."""
        return {
            "ttft": self._ttft_sum,
            "ttst": self._ttst_sum,
            "tpot": self._tpot_sum,
            "scheduling": self._scheduling_sum,
            "allocation": self._allocation_sum,
            "reading": self._reading_sum,
            "prefill": self._prefill_sum,
        }

    @property
    def counts(self) -> dict[str, int]:
        """Requests counted in the ``ttft``, ``ttst`` and ``tpot`` sums."""
        return {"ttft": self._ttft_n, "ttst": self._ttst_n, "tpot": self._ttst_n}

    def _stop_rule(self, ttft: float) -> None:
        """Online stopping rule: stop once the mean TTFT of the last STOP_WINDOW requests > SLO."""
        window = self._window
        window.append(ttft)
        self._window_sum += ttft
        if len(window) > STOP_WINDOW:
            self._window_sum -= window.pop(0)
        stop_s = self.stop_ttft_s
        if len(window) == STOP_WINDOW and stop_s is not None and self._window_sum / STOP_WINDOW > stop_s:
            self.stopped_reason = "ttft"
            self.kernel.stop()

    def agent_done(self, agent: Agent) -> None:
        self.agent_jct.append(agent.t_end - agent.t_start)

    def finish(self, sim: RunState) -> dict:
        """Close the record file, check invariants (raise on violation) and summarise the run."""
        if self._file is not None:
            self._file.close()
            self._file = None
        check_invariants(sim, self)
        sums, counts = self.sums, self.counts
        n = max(counts["ttft"], 1)
        cluster = sim.cluster
        snic = [node.snic_read_bytes + node.snic_write_bytes for node in cluster.nodes]
        attn_sum = sum(u.attn_ratio_sum for u in sim.prefill_units)
        attn_n = sum(u.attn_ratio_n for u in sim.prefill_units)
        end = max((a.t_end for a in sim.agents if not math.isnan(a.t_end)), default=0.0)
        summary: dict = {
            "system": self.system_name,
            "jct_s": end,
            "mean_agent_jct_s": (sum(self.agent_jct) / len(self.agent_jct) if self.agent_jct else None),
            "num_agents": len(sim.agents),
            "agents_finished": len(sim.agents) - sim.agents_left,
            "num_requests": self.num_requests,
            "mean_ttft_s": sums["ttft"] / n,
            "mean_ttst_s": sums["ttst"] / max(counts["ttst"], 1),
            "mean_tpot_s": sums["tpot"] / max(counts["tpot"], 1),
            "ttft_breakdown_s": {k: sums[k] / n for k in BREAKDOWN},
            "snic_max_over_avg": _max_over_avg(snic),
            "attn_max_over_avg": attn_sum / attn_n if attn_n else 1.0,
            "attn_max_over_avg_early": _early_attn(sim, self.t_first),
            "attn_iter_max_over_avg_early": _early_attn_iterations(sim, self.t_first),
            "bytes": cluster.bytes_by_class(),
            "max_link_utilisation": check_utilisation(cluster.links(), sim.kernel.now_s),
            "events": sim.kernel.events,
            "sim_time_s": sim.kernel.now_s,
            "stopped": self.stopped_reason or None,
            "cost_model": sim.costs.source,
        }
        if sim.config.profile is not None:  # the local cluster: as the runtime's /metrics counts
            summary.update(_local_counts(sim))
        if self.keep:
            summary["latency"] = {
                "t_arrive": list(self.t_arrive),
                "ttft": list(self.ttft),
                "ttst": list(self.ttst),
                "tpot": list(self.tpot),
            }
        return summary


def _local_counts(sim: RunState) -> dict:
    """The local cluster's per-node storage reads (PE nodes first) and each engine's compute
    seconds, PEs first (what its process's CPU time is)."""
    return {
        "snic_read_bytes_by_node": [node.snic_read_bytes for node in sim.cluster.nodes],
        "engine_compute_s": [u.cpu_s for u in sim.prefill_units] + [u.cpu_s for u in sim.decode_units],
    }


def check_invariants(sim: RunState, metrics: Metrics) -> None:
    """Fail loudly: bytes read == hit tokens x KV bytes/token; oracle has no I/O; every agent
    finished (offline runs that were not stopped); no link above 100% (in check_utilisation)."""
    # reads still waiting for buffer room when a run is cut short (online) are not read yet
    queued = sim.storage.queued_read_tokens()
    moves_kv = sim.load.moves_kv
    expected = (metrics.hit_tokens - queued) * sim.bpt if moves_kv else 0.0
    read = sim.storage.bytes_read
    if abs(read - expected) > 1e-6 * max(expected, 1.0):
        raise AssertionError(f"bytes read {read:.6g} != hit tokens x KV bytes {expected:.6g}")
    if not moves_kv:  # persists only where the load path pays them (the local cluster's Oracle)
        cluster = sim.cluster
        persists = sum(node.snic_write_bytes for node in cluster.nodes)
        busy = sum(g.tx.kv_bytes + g.rx.kv_bytes for g in cluster.gpus) + read
        busy += sum(n.snic.kv_bytes for n in cluster.nodes if n.snic_tx is not n.snic)
        if not sim.load.pays_persists:
            busy += persists
        if busy > 0:
            raise AssertionError(f"oracle moved {busy:.3g} KV bytes over links")
    if sim.config.aps is None and not metrics.stopped_reason and sim.agents_left:
        raise AssertionError(f"{sim.agents_left} agents did not finish")


def early_cutoff_s(t_first: array | list[float], fraction: float = EARLY_FRACTION) -> float:
    """Time by which the first ``fraction`` of the requests (at least one) had their first token
    (0.0 without requests)."""
    if not t_first:
        return 0.0
    k = max(1, math.ceil(fraction * len(t_first)))
    return sorted(t_first)[k - 1]


def _early_attn(sim: RunState, t_first: array) -> float:
    """Attention time max/avg inside an EP group early in the run (spec section 10), read as the
    storage-NIC max/avg next to it is (per NIC traffic totals): :func:`gpu_totals_balance` of each
    multi-GPU unit over the iterations that start by :func:`early_cutoff_s`, the mean over the
    units that computed (1.0 when there are none)."""
    cutoff = early_cutoff_s(t_first)
    ratios: list[float] = []
    for unit in sim.prefill_units:
        ratio = gpu_totals_balance(len(unit.states), unit.iter_t, unit.attn_gpu, cutoff)
        if ratio is not None:
            ratios.append(ratio)
    return sum(ratios) / len(ratios) if ratios else 1.0


def gpu_totals_balance(n: int, iter_t: array, attn_gpu: array, cutoff: float) -> float | None:
    """Each of ``n`` GPUs' attention time totalled over the iterations that start by ``cutoff``
    (``iter_t``: start times in order; ``attn_gpu``: ``n`` values an iteration, 0.0 for a GPU
    without a batch, which still waits at the MoE), the max over their mean; None for fewer
    than two GPUs or no attention in the window."""
    if n < 2:
        return None
    totals = [0.0] * n
    for k, t in enumerate(iter_t):
        if t > cutoff:
            break
        base = k * n
        for i in range(n):
            totals[i] += attn_gpu[base + i]
    total = sum(totals)
    return max(totals) * n / total if total > 0 else None


def _early_attn_iterations(sim: RunState, t_first: array) -> float:
    """The per-iteration reading of the early attention balance (beside ``_early_attn``'s
    per-GPU totals; docs/notes/sim-calibration.md): the mean, over
    the multi-GPU PE iterations that start by :func:`early_cutoff_s`, of each iteration's attention
    max/avg over the GPUs that have a batch (1.0 when there are none). A GPU with a batch has a
    positive attention time, so those are the non-zero values of the iteration's record."""
    cutoff = early_cutoff_s(t_first)
    total, count = 0.0, 0
    for unit in sim.prefill_units:
        n = len(unit.states)
        attn_gpu = unit.attn_gpu
        for k, t in enumerate(unit.iter_t):
            if t > cutoff:
                break
            attn = [a for a in attn_gpu[k * n : (k + 1) * n] if a > 0.0]
            if len(attn) > 1 and sum(attn) > 0:
                total += max(attn) * len(attn) / sum(attn)
                count += 1
    return total / count if count else 1.0


def _max_over_avg(values: list[float]) -> float:
    avg = sum(values) / len(values) if values else 0.0
    return max(values) / avg if avg > 0 else 1.0


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6f}"
    return str(value)
