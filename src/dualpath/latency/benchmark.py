"""The benchmark a row measured: closed-loop clients against a simulated engine.

``clients`` clients start together, each sends a request of ``isl`` prompt tokens (no prefix
reuse) and exactly ``osl`` output tokens, and sends its next one the moment its previous one's last
token arrives, until it has sent ``requests_per_client``; TTFT and TPOT are the means over every
request of the run, its ramp (the first burst) included. TPOT follows genai-perf / aiperf:
``(last token - first token) / (osl - 1)``.

``REQUESTS_PER_CLIENT = 10``: Dynamo's benchmark script (ai-dynamo/dynamo benchmarks/llm/perf.sh)
runs aiperf with ``--request-count concurrency x 10`` after ``--warmup-request-count concurrency x
2``, and aiperf waits for every warmup response before it starts profiling (its warmup docs), so
the measured phase starts from an idle engine with ``concurrency`` requests at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import require
from dualpath.latency.defaults import SchedulerDefaults
from dualpath.latency.engine import Engine
from dualpath.latency.requests import Req
from dualpath.latency.steps import StepCost
from dualpath.sim.kernel import Kernel

REQUESTS_PER_CLIENT = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """Means over the run's requests (seconds): ``wait_s`` from arrival to the start of its first
    prefill iteration, ``prefill_s`` from there to its first token (TTFT = the two); ``stall_s``
    per output token: the share of TPOT spent in iterations that carried prompt tokens."""

    ttft_s: float
    tpot_s: float
    wait_s: float
    prefill_s: float
    stall_s: float
    requests: int
    iterations: int
    duration_s: float
    preemptions: int

    def to_json(self) -> dict[str, float]:
        return {
            "requests": float(self.requests),
            "iterations": float(self.iterations),
            "run_s": self.duration_s,
            "preemptions": float(self.preemptions),
            "wait_ms": self.wait_s * 1e3,
            "prefill_ms": self.prefill_s * 1e3,
        }


def summarize(reqs: list[Req], osl: int, iterations: int, duration_s: float) -> RunResult:
    """Means over finished requests (every request of a completed run)."""
    require(bool(reqs), "requests", 0, "the run finished no request")
    n = len(reqs)
    ttft = [r.first_token_s - r.sent_s for r in reqs if r.first_token_s is not None]
    require(len(ttft) == n, "requests", n - len(ttft), "requests without a first token")
    tpot = [(r.done_s - r.first_token_s) / (osl - 1) for r in reqs if r.done_s and osl > 1]  # type: ignore[operator]
    wait = [(r.first_scheduled_s or r.sent_s) - r.sent_s for r in reqs]
    stall = [r.stalled_s / (osl - 1) for r in reqs] if osl > 1 else [0.0]
    return RunResult(
        ttft_s=sum(ttft) / n,
        tpot_s=sum(tpot) / len(tpot) if tpot else 0.0,
        wait_s=sum(wait) / n,
        prefill_s=sum(ttft) / n - sum(wait) / n,
        stall_s=sum(stall) / len(stall),
        requests=n,
        iterations=iterations,
        duration_s=duration_s,
        preemptions=sum(r.preemptions for r in reqs),
    )


class ClosedLoop:
    """``clients`` closed-loop clients; ``send(req)`` hands a request to the serving side, which
    calls :meth:`done` when its last token is out."""

    def __init__(self, kernel: Kernel, *, isl: int, osl: int, clients: int, requests_per_client: int) -> None:
        require(clients >= 1, "batch_size", clients, "client concurrency must be >= 1")
        require(requests_per_client >= 1, "requests_per_client", requests_per_client, "must be >= 1")
        self.kernel = kernel
        self.isl, self.osl = isl, osl
        self.left = [requests_per_client] * clients
        self.finished: list[Req] = []
        self.send = self._unset
        self._next_id = 0

    @staticmethod
    def _unset(req: Req) -> None:
        raise RuntimeError("ClosedLoop.send is not connected")

    def start(self) -> None:
        for client in range(len(self.left)):
            self._issue(client)

    def _issue(self, client: int) -> None:
        self.left[client] -= 1
        req = Req(rid=self._next_id, client=client, isl=self.isl, osl=self.osl, arrival_s=self.kernel.now_s)
        self._next_id += 1
        self.send(req)

    def done(self, req: Req) -> None:
        self.finished.append(req)
        if self.left[req.client] > 0:
            self._issue(req.client)


def run_agg(
    cost: StepCost,
    defaults: SchedulerDefaults,
    kv_capacity_tokens: float,
    *,
    clients: int,
    requests_per_client: int = REQUESTS_PER_CLIENT,
) -> RunResult:
    """One aggregated engine rank serving ``clients`` closed-loop clients."""
    kernel = Kernel()
    loop = ClosedLoop(
        kernel, isl=cost.isl, osl=cost.osl, clients=clients, requests_per_client=requests_per_client
    )
    engine = Engine(kernel, defaults, cost, kv_capacity_tokens, loop.done)
    loop.send = engine.submit
    loop.start()
    end_s = kernel.run()
    expected = clients * requests_per_client
    require(len(loop.finished) == expected, "requests", len(loop.finished), f"the run finished of {expected}")
    return summarize(loop.finished, cost.osl, engine.iterations, end_s)
