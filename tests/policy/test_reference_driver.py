"""End to end through the ReferenceDriver: every request is assigned once and finishes, loads
return to zero, for every policy."""

from __future__ import annotations

import random

import pytest

from dualpath.policy import (
    AttentionFlops,
    LinearAttentionPredictor,
    RequestInfo,
    SchedulerConfig,
    make_scheduler,
    snic_traffic_balance,
)
from dualpath.policy.reference import ReferenceDriver
from dualpath.policy.scheduler import POLICY_NAMES

PRED = LinearAttentionPredictor(
    flops_model=AttentionFlops(num_heads=8, qk_head_dim=64, v_head_dim=64), seconds_per_flop=1e-10
)


def _run(name: str) -> ReferenceDriver:
    cfg = SchedulerConfig(alpha_tokens=5000, beta_tokens=8000, attention_predictor=PRED)
    driver = ReferenceDriver(
        make_scheduler(name, cfg),
        num_pe_groups=2,
        num_de_groups=3,
        engines_per_group=4,
        de_hbm_tokens=20_000,
        read_tokens_per_s=100.0,
    )
    rng = random.Random(7)
    total = 120
    for i in range(total):
        driver.arrive(
            RequestInfo(
                request_id=f"r{i}",
                cached_len=64 * rng.randint(0, 60),
                new_len=rng.randint(1, 500),
                gen_len=rng.randint(1, 100),
            )
        )
    finished = 0
    for r in range(2000):
        driver.de_fetch(driver.de_nodes[r % 3])
        driver.pe_fetch(driver.pe_nodes[r % 2])
        for node in driver.pe_nodes:
            for engine in driver.engines[node]:
                driver.pe_step(engine.engine_id)
        driver.drain_reads(2000)
        while driver.prefilled:
            driver.finish_decode(driver.prefilled.popleft())
            finished += 1
        if finished == total:
            break
    assert finished == total
    return driver


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_request_finishes_and_loads_drain(name: str) -> None:
    driver = _run(name)
    total = 120
    assert driver.num_assigned == 2 * total  # one DE and one PE assignment each
    for engines in driver.engines.values():
        for e in engines:
            assert (e.num_seqs, e.num_tokens) == (0, 0)
            assert e.free_hbm_tokens == (20_000 if e.engine_id >= 8 else 0)


def test_unknown_policy_lists_choices() -> None:
    with pytest.raises(KeyError, match="dualpath-split"):
        make_scheduler("dual")


def test_dual_path_pools_storage_bandwidth() -> None:
    """Basic reads only on PE nodes; the shorter-queue policies spread reads over all nodes."""
    balance = {name: snic_traffic_balance(_run(name).read_total) for name in POLICY_NAMES}
    assert balance["basic"] >= 5 / 2  # 2 of 5 nodes carry all reads
    for name in ("rr-shorter-queue", "dualpath", "dualpath-split"):
        assert balance[name] < 1.6, balance
    assert balance["dualpath-split"] < balance["basic"]
