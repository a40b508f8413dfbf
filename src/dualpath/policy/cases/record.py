"""Records conformance cases: each policy drives a small ReferenceDriver through a seeded random
scenario (arrivals, DE and PE fetches, PE iterations, read drains, decode completions), plus a few
hand-built edge cases. Deterministic: same seed, same cases."""

from __future__ import annotations

import random

from dualpath.policy.config import SchedulerConfig
from dualpath.policy.conformance import Case, Step
from dualpath.policy.predictor import AttentionFlops, LinearAttentionPredictor
from dualpath.policy.reference import ReferenceDriver
from dualpath.policy.scheduler import POLICY_NAMES, make_scheduler
from dualpath.policy.views import (
    BatchItem,
    BatchView,
    EngineLoad,
    GroupLoad,
    NodeReadQueue,
    PendingPrefill,
    PrefillFetchView,
    RequestInfo,
)

PREDICTOR = LinearAttentionPredictor(
    flops_model=AttentionFlops(num_heads=8, qk_head_dim=64, v_head_dim=64),
    seconds_per_flop=1e-10,
    intercept_s=0.002,
)


def case_config(**overrides: object) -> SchedulerConfig:
    fields: dict[str, object] = {
        "alpha_tokens": 3000,
        "beta_tokens": 4000,
        "compute_quota_s": 0.3,
        "attention_predictor": PREDICTOR,
    }
    fields.update(overrides)
    return SchedulerConfig(**fields)  # type: ignore[arg-type]


def scenario(policy: str, seed: int, rounds: int = 12, pe_scope: str | None = None) -> Case:
    """``pe_scope``: the config's (None: the policy's default); a case with one is named for it."""
    rng = random.Random(seed)
    config = case_config(pe_scope=pe_scope)
    driver = ReferenceDriver(
        make_scheduler(policy, config),
        num_pe_groups=2,
        num_de_groups=2,
        engines_per_group=4,
        de_hbm_tokens=9_000,
        read_tokens_per_s=1000.0,
        record=True,
    )
    count = 0
    for r in range(rounds):
        for _ in range(rng.randint(2, 9)):
            driver.arrive(
                RequestInfo(
                    request_id=f"q{count}",
                    cached_len=64 * rng.randint(0, 64),
                    new_len=rng.randint(1, 600),
                    gen_len=rng.randint(1, 200),
                )
            )
            count += 1
        driver.de_fetch(driver.de_nodes[r % 2], now_s=float(r))
        driver.pe_fetch(driver.pe_nodes[r % 2], now_s=float(r) + 0.5)
        for node in driver.pe_nodes if r % 3 == 2 else ():  # PEs compute every third round
            for engine in driver.engines[node]:
                driver.pe_step(engine.engine_id, now_s=float(r) + 0.75)
        driver.drain_reads(rng.randint(0, 3000))
        for _ in range(min(rng.randint(0, 3), len(driver.prefilled))):
            driver.finish_decode(driver.prefilled.popleft())
    steps = tuple(Step(kind=k, view=v, plan=p) for k, v, p in driver.log)
    scope = f"-{pe_scope}" if pe_scope else ""
    return Case(name=f"{policy}{scope}-random-{seed}", policy=policy, config=config, steps=steps)


def edge_cases() -> list[Case]:
    """Hand-built views: a lone request too big for the quota, an all-overloaded PE group, a split
    that lands between blocks, a congested PE node (C3)."""
    config = case_config()
    cases = []
    lone = BatchView(
        now_s=0.0,
        engine_id=0,
        waiting=(
            BatchItem(request_id="huge", cached_len=2_000_000, new_len=50),
            BatchItem(request_id="next", cached_len=10, new_len=5),
        ),
    )
    pe = GroupLoad(
        group_id=0,
        node_id=0,
        engines=(
            EngineLoad(engine_id=0, num_seqs=3, num_tokens=7000),
            EngineLoad(engine_id=1, num_seqs=1, num_tokens=5000),
        ),
    )
    reqs = tuple(
        PendingPrefill(
            request=RequestInfo(request_id=f"e{i}", cached_len=64 * (5 + i), new_len=100),
            de_engine_id=8,
            de_node_id=2,
        )
        for i in range(4)
    )
    reads = (
        NodeReadQueue(node_id=0, read_queue_tokens=4000, read_tokens_per_s=2000.0),
        NodeReadQueue(node_id=2, read_queue_tokens=100, read_tokens_per_s=500.0),
    )
    fetch = PrefillFetchView(now_s=1.0, groups=(pe,), queue=reqs, read_queues=reads)
    for policy in POLICY_NAMES:
        sched = make_scheduler(policy, config)
        steps = (
            Step(kind="batch", view=lone, plan=sched.plan_prefill_batch(lone)),
            Step(kind="prefill", view=fetch, plan=sched.assign_prefill(fetch)),
        )
        cases.append(Case(name=f"{policy}-edges", policy=policy, config=config, steps=steps))
    return cases


def record_cases(seed: int = 0) -> tuple[Case, ...]:
    """Every policy at its default PE scope (strict leader fetch), then basic and dualpath with
    ``pe_scope="central"`` (every PE group a candidate) on the same seeds, then the edge cases."""
    cases = [scenario(p, seed + i) for i, p in enumerate(POLICY_NAMES)]
    cases += [scenario(p, seed + POLICY_NAMES.index(p), pe_scope="central") for p in ("basic", "dualpath")]
    return tuple(cases + edge_cases())
