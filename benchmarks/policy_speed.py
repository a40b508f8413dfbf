"""Scheduler speed at the paper's largest scale: 48P96D = 1,152 engines in 144 groups of 8.

Keeps 10,000 requests queued (the 64K-bucket shape: ~32.7K context, 429 appended, 176 generated)
and runs DE fetches, PE fetches and PE batch planning for every group/engine in rounds, through the
ReferenceDriver (the smallest driver following docs/policy.md). Prints assignments per second of
scheduler time (policy calls only) and of driver + policy time, next to the request rate the
paper's 48P96D offline run needs: 48K (49,152) agents x 157 turns / 3,201 s (section 10) ~= 2,411
req/s,
each request needing one DE and one PE assignment. One core, one process; times are this
process's CPU seconds (time.process_time), so other load on the machine inflates them less.

    .venv/bin/python benchmarks/policy_speed.py [--requests 100000] [--policy dualpath] [--pe-scope central]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from dualpath.policy import (
    AttentionFlops,
    LinearAttentionPredictor,
    RequestInfo,
    SchedulerConfig,
    make_scheduler,
)
from dualpath.policy.reference import ReferenceDriver

PAPER_AGENTS = 48 * 1024  # "48K agents" = 24 x the 2P4D run's 2,048 agents
PAPER_TURNS = 157  # mean turns per trajectory, 64K bucket (Table 2)
PAPER_JCT_S = 3201.0  # 48P96D offline JCT (section 10)
KV_BYTES_PER_TOKEN = 40_016  # DeepSeek-V3.2
SNIC_BYTES_PER_S = 50e9


class TimedScheduler:
    """Wraps a scheduler and accumulates the CPU time spent inside each policy call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = {"decode": 0.0, "prefill": 0.0, "batch": 0.0}
        self.calls = {"decode": 0, "prefill": 0, "batch": 0}

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def _timed(self, kind: str, fn: Any, view: Any) -> Any:
        t0 = time.process_time()
        plan = fn(view)
        self.seconds[kind] += time.process_time() - t0
        self.calls[kind] += 1
        return plan

    def assign_decode(self, view: Any) -> Any:
        return self._timed("decode", self.inner.assign_decode, view)

    def assign_prefill(self, view: Any) -> Any:
        return self._timed("prefill", self.inner.assign_prefill, view)

    def plan_prefill_batch(self, view: Any) -> Any:
        return self._timed("batch", self.inner.plan_prefill_batch, view)


def make_request(rng: random.Random, i: int) -> RequestInfo:
    context = rng.randint(1_000, 64_000)
    cached = context // 64 * 64
    return RequestInfo(
        request_id=f"r{i}", cached_len=cached, new_len=rng.randint(50, 800), gen_len=rng.randint(20, 330)
    )


def run(
    policy: str, total_requests: int, queued: int, seed: int, pe_scope: str = "group"
) -> dict[str, float]:
    predictor = LinearAttentionPredictor(
        flops_model=AttentionFlops(num_heads=128, qk_head_dim=576, v_head_dim=512, sparse_top_k=2048),
        seconds_per_flop=1 / 400e12,
        intercept_s=2e-4,
    )
    config = SchedulerConfig.from_rates(
        snic_bytes_per_s=SNIC_BYTES_PER_S,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        prefill_tokens_per_s=121_000,
        attention_predictor=predictor,
        pe_scope=pe_scope,
    )
    central = pe_scope == "central"
    sched = TimedScheduler(make_scheduler(policy, config))
    driver = ReferenceDriver(
        sched,
        num_pe_groups=48,
        num_de_groups=96,
        engines_per_group=8,
        de_hbm_tokens=600_000,
        read_tokens_per_s=SNIC_BYTES_PER_S / KV_BYTES_PER_TOKEN,
    )
    rng = random.Random(seed)
    arrived = finished = 0
    for _ in range(queued):
        driver.arrive(make_request(rng, arrived))
        arrived += 1
    t0 = time.process_time()
    first = driver.de_fetch(driver.de_nodes[0])  # phase 1 drains all queued requests at once
    first_fetch_s = time.process_time() - t0
    assert len(first.routings) == queued
    while finished < total_requests:
        for node in driver.de_nodes:
            driver.de_fetch(node)
        for node in driver.pe_nodes:
            driver.pe_fetch(node, window=2048, central=central)
        for node in driver.pe_nodes:
            for engine in driver.engines[node]:
                driver.pe_step(engine.engine_id)
        driver.drain_reads(10**9)
        while driver.prefilled:
            driver.finish_decode(driver.prefilled.popleft())
            finished += 1
        while arrived - finished < queued and arrived < total_requests + queued:
            driver.arrive(make_request(rng, arrived))  # keep `queued` requests in the system
            arrived += 1
    wall = time.process_time() - t0
    policy_s = sum(sched.seconds.values())
    return {
        "finished": finished,
        "assignments": driver.num_assigned,
        "wall_s": wall,
        "policy_s": policy_s,
        "first_fetch_s": first_fetch_s,
        **{f"{k}_s": v for k, v in sched.seconds.items()},
        **{f"{k}_calls": v for k, v in sched.calls.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", default="dualpath")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pe-scope",
        choices=("central", "group"),
        default="group",
        help="group (the policies' default): every PE fetch sees its own 8 PEs; central: all 384",
    )
    args = parser.parse_args()
    r = run(args.policy, args.requests, args.queued, args.seed, args.pe_scope)
    needed = PAPER_AGENTS * PAPER_TURNS / PAPER_JCT_S
    req_policy = r["finished"] / r["policy_s"]
    req_total = r["finished"] / r["wall_s"]
    mode = "central" if args.pe_scope == "central" else "leader-fetch"
    print(
        f"policy={args.policy} mode={mode} engines=1152 groups=144 queued={args.queued} "
        f"requests={r['finished']:.0f} assignments={r['assignments']:.0f}"
    )
    print(
        f"  policy CPU time {r['policy_s']:.2f} s (decode {r['decode_s']:.2f} in "
        f"{r['decode_calls']} fetches, prefill {r['prefill_s']:.2f} in {r['prefill_calls']}, "
        f"batch {r['batch_s']:.2f} in {r['batch_calls']}); driver+policy {r['wall_s']:.2f} s CPU"
    )
    print(f"  first DE fetch draining {args.queued} queued requests: {r['first_fetch_s'] * 1e3:.1f} ms")
    print(f"  assignments/s (policy only): {r['assignments'] / r['policy_s']:,.0f}")
    print(
        f"  requests/s placed (DE + PE + batches), policy only: {req_policy:,.0f}; "
        f"with reference driver: {req_total:,.0f}"
    )
    print(
        f"  paper 48P96D offline needs: {needed:,.0f} req/s "
        f"(= {PAPER_AGENTS} agents x {PAPER_TURNS} turns / {PAPER_JCT_S:.0f} s)"
    )
    print(
        f"  ratio policy-only / needed: {req_policy / needed:.1f}x; "
        f"driver+policy / needed: {req_total / needed:.1f}x (one core)"
    )


if __name__ == "__main__":
    main()
