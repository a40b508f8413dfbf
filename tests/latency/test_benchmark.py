"""The simulated benchmark: every request finishes, each backend's batch rules, the closed form at
one request, disaggregated TTFT parts, preemption under a small KV pool. Bundled kernel tables."""

from __future__ import annotations

import dataclasses

import pytest

from dualpath.cost.deployment import Deployment, Layout, predict
from dualpath.latency.benchmark import run_agg
from dualpath.latency.defaults import aiconfigurator_limits, scheduler_defaults
from dualpath.latency.predict import simulate
from dualpath.latency.requests import Req
from dualpath.latency.schedulers import Queues, form_batch

GIB = 1 << 30


def _dep(**kw: object) -> Deployment:
    base: dict[str, object] = dict(
        model="Qwen/Qwen3-32B",
        system="h100_sxm",
        backend="trtllm",
        precision="fp8",
        isl=1024,
        osl=64,
        batch_size=8,
        layout=Layout(tp=2),
    )
    base.update(kw)
    return Deployment(**base)  # type: ignore[arg-type]


def _queues(n: int, isl: int, cap: float = 1e9) -> Queues:
    q = Queues(kv_capacity=cap)
    for i in range(n):
        q.waiting.append(Req(rid=i, client=i, isl=isl, osl=16, arrival_s=0.0))
    return q


def test_vllm_fills_the_token_budget_and_chunks_the_last_prompt() -> None:
    d = scheduler_defaults("vllm", "0.12.0", 80e9)
    assert (d.token_budget, d.max_running, d.overlap) == (8192, 1024, False)
    q = _queues(3, 3000)
    batch = form_batch(q, d, [], visible=3)
    assert [tok for _, tok, _ in batch.chunks] == [3000, 3000, 2192]
    assert [done for _, _, done in batch.chunks] == [True, True, False]
    nxt = form_batch(q, d, [], visible=0)  # the cut prompt continues first, beside two decode rows
    assert [tok for _, tok, _ in nxt.chunks] == [808] and len(nxt.rows) == 2


def test_trtllm_packs_whole_prompts_and_waits_for_room() -> None:
    d = scheduler_defaults("trtllm", "1.0.0rc3", 80e9)
    q = _queues(3, 3000)
    batch = form_batch(q, d, [], visible=3)
    assert [tok for _, tok, _ in batch.chunks] == [3000, 3000]  # a third does not fit 8192 whole
    assert len(q.running) == 2 and len(q.waiting) == 1


def test_sglang_runs_prefill_apart_unless_mixed() -> None:
    d = scheduler_defaults("sglang", "0.5.1", 80e9)
    q = _queues(2, 1000)
    first = form_batch(q, d, [], visible=1)
    assert len(first.chunks) == 1 and not first.rows
    second = form_batch(q, d, [], visible=1)  # a prompt waits: prefill again, the decode pauses
    assert len(second.chunks) == 1 and not second.rows
    mixed = aiconfigurator_limits(d, "agg", 8, 1000)
    assert mixed.mixed and mixed.prefill_tokens == 2500
    q = _queues(2, 1000)
    form_batch(q, mixed, [], visible=1)
    both = form_batch(q, mixed, [], visible=1)
    assert len(both.chunks) == 1 and len(both.rows) == 1


def test_on_demand_pool_preempts_the_newest_request() -> None:
    d = scheduler_defaults("vllm", "0.14.0", 80e9)
    q = _queues(2, 100, cap=201)
    form_batch(q, d, [], visible=2)  # both prompts in: 200 of 201 tokens
    form_batch(q, d, [], visible=0)  # two decode rows need 2 more: the newest goes back
    assert len(q.running) == 1 and q.waiting[0].rid == 1 and q.waiting[0].preemptions == 1
    assert q.waiting[0].prompt == 100 + q.waiting[0].generated  # recomputes its output too


@pytest.mark.parametrize("backend", ["trtllm", "vllm", "sglang"])
@pytest.mark.parametrize("clients", [1, 5, 16])
def test_every_request_finishes_with_sane_times(backend: str, clients: int) -> None:
    p = simulate(_dep(backend=backend, batch_size=clients), requests_per_client=3)
    batch = p.breakdown_ms["batch"]
    assert batch["requests"] == 3 * clients
    assert p.ttft_s > 0 and p.tpot_s > 0
    assert p.ttft_s * 1e3 == pytest.approx(sum(p.breakdown_ms["ttft"].values()))
    assert p.tpot_s * 1e3 == pytest.approx(sum(p.breakdown_ms["tpot"].values()))
    assert p.details is not None and p.details["scheduler"]["backend"] == backend  # type: ignore[index]


@pytest.mark.parametrize(
    ("backend", "version"),
    [("trtllm", "1.0.0rc3"), ("vllm", "0.12.0"), ("vllm", "0.18.0"), ("sglang", "0.5.1")],
)
def test_one_request_at_a_time_agrees_with_the_closed_form(backend: str, version: str) -> None:
    # one client: nothing queues, the closed form is exact; the simulation's steady requests
    # (each after the first) see what the closed form's period holds
    dep = _dep(backend=backend, backend_version=version, batch_size=1)
    sim, closed = simulate(dep, requests_per_client=4), predict(dep)
    assert sim.breakdown_ms["batch"]["ttft_steady_ms"] == pytest.approx(closed.ttft_s * 1e3, rel=2e-3)
    assert sim.tpot_s == pytest.approx(closed.tpot_s, rel=2e-3)


def test_the_ramp_counts_in_the_mean_ttft() -> None:
    # 16 clients start together: the first round queues behind each other's prompts
    p = simulate(_dep(backend="vllm", batch_size=16, isl=4000), requests_per_client=2)
    batch = p.breakdown_ms["batch"]
    assert p.ttft_s * 1e3 > batch["ttft_steady_ms"]


def test_aiconfigurator_limits_hold_one_prompt_per_iteration() -> None:
    d = aiconfigurator_limits(scheduler_defaults("trtllm", "1.0.0rc3", 80e9), "agg", 8, 1024)
    assert (d.token_budget, d.max_running) == (1536, 8)  # 8 + 1024 + 500, to the 32-token block
    v = aiconfigurator_limits(scheduler_defaults("vllm", "0.12.0", 80e9), "agg", 8, 1024)
    assert (v.token_budget, v.max_running) == (8 + 1024 + 1500, 512)
    p = aiconfigurator_limits(scheduler_defaults("trtllm", "1.0.0rc3", 80e9), "prefill", 1, 4000)
    assert not p.overlap and p.token_budget == 4512


def test_disagg_ttft_holds_prefill_hand_off_and_first_decode_step() -> None:
    dep = _dep(
        mode="disagg",
        batch_size=8,
        prefill=Layout(tp=2),
        prefill_workers=2,
        decode=Layout(tp=2),
        decode_workers=1,
        decode_batch=8,
    )
    p = simulate(dep, requests_per_client=3)
    parts = p.breakdown_ms["ttft"]
    assert set(parts) == {"prefill_queue", "prefill", "kv_transfer", "decode_queue_and_first_step"}
    assert parts["kv_transfer"] > 0 and parts["prefill"] > 0 and parts["decode_queue_and_first_step"] > 0
    assert p.ttft_s * 1e3 == pytest.approx(sum(parts.values()))
    assert p.details is not None and p.details["prefill_ranks"] == 2


def test_a_small_kv_pool_queues_clients_and_raises_ttft() -> None:
    dep = _dep(backend="vllm", batch_size=16, isl=2000, osl=32)
    wide = simulate(dep, requests_per_client=2)
    from dualpath.cost.deployment import forward_for
    from dualpath.latency.ranks import memoised
    from dualpath.latency.steps import step_cost

    _, forward = forward_for(dep)
    fw = memoised(forward(dep.layout, ""))
    tight = run_agg(
        step_cost(fw, 2000, 32),
        scheduler_defaults("vllm", None, 80e9),
        4 * 2032.0,
        clients=16,
        requests_per_client=2,
    )
    assert tight.ttft_s > wide.ttft_s
    assert dataclasses.asdict(tight)["requests"] == 32


def test_disagg_routes_round_robin_over_workers_and_by_load_inside_one() -> None:
    """Dynamo's default router cycles through workers; a worker's attention-DP ranks take the
    least-loaded one (latency/disagg.py, Routing)."""
    from dualpath.cost.deployment import forward_for
    from dualpath.latency.disagg import Disagg
    from dualpath.sim.kernel import Kernel

    dep = _dep(
        model="deepseek-ai/DeepSeek-V3",
        mode="disagg",
        batch_size=8,
        prefill=Layout(tp=8, attention_dp=8, moe_ep=8),
        prefill_workers=1,
        decode=Layout(tp=8, attention_dp=8, moe_ep=8),
        decode_workers=2,
        decode_batch=16,
    )
    _, forward = forward_for(dep)
    system = Disagg(Kernel(), dep, forward)
    assert len(system.decode) == 16
    picks = [system._route("decode", system.decode) for _ in range(4)]
    assert [p // 8 for p in picks] == [0, 1, 0, 1]  # worker by turn
    system.decode[0].q.waiting.append(Req(rid=0, client=0, isl=8, osl=8, arrival_s=0.0))
    assert system._route("decode", system.decode) == 1  # rank 0 busy: its idle neighbour
    assert system._route("decode", system.decode, "least_loaded") == 1
