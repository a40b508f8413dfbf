"""The decode unit admits requests at step boundaries and charges lockstep join stalls once per step
(the largest GPU's), and the DE engine sees a finished prefill at its next step boundary."""

from __future__ import annotations

import pytest

from dualpath.sim.costs import CostCache
from dualpath.sim.decode import DecodeUnit, DeState
from dualpath.sim.kernel import Kernel
from dualpath.sim.request import Agent, Req
from dualpath.spec.hardware import get_gpu
from dualpath.spec.models import MODELS


def _req(i: int, gen_len: int, prompt_len: int = 4096) -> Req:
    return Req(Agent(i, f"t{i}", [(prompt_len, gen_len)]), 0, 0, prompt_len, gen_len, 64)


def _unit(num_gpus: int = 2) -> tuple[Kernel, DecodeUnit, list[DeState], list]:
    kernel = Kernel()
    costs = CostCache(
        MODELS["deepseek-v3.2"],
        get_gpu("h100"),
        name="roofline",
        pe_ep_size=16,
        de_ep_size=32,
        num_gpus_per_node=8,
    )
    states = [DeState(i, 0, 1 << 20) for i in range(num_gpus)]
    done: list = []
    unit = DecodeUnit(
        states,
        kernel=kernel,
        costs=costs,
        gpus=[None] * num_gpus,  # type: ignore[list-item]  # no link costs (model bytes 0)
        model_bytes_per_token=0.0,
        on_done=lambda req, st: done.append((req.agent.index, kernel.now_s)),
    )
    return kernel, unit, states, done


def test_a_join_waits_for_the_next_step_boundary_but_an_idle_unit_starts_at_once() -> None:
    kernel, unit, (a, b), done = _unit()
    first = _req(1, gen_len=11)
    kernel.call_at(0.0, lambda: unit.join(first, a), 0)
    kernel.run(until_s=0.0)
    step = unit.step_s
    assert first.t_join == 0.0 and first.target == 10.0  # an idle unit: its first step now
    second = _req(2, gen_len=4)
    t = 2.4 * step
    kernel.call_at(t, lambda: unit.join(second, b, copied_tokens=0), 0)
    kernel.run(until_s=t + 1e-9)
    step2 = unit.step_s
    assert second.target == float(int(second.target))  # enters at a whole step
    assert second.t_join > t and second.t_join - t < step2  # the rest of the current step
    kernel.run()
    finish = dict(done)
    # its last token comes gen_len - 1 steps after the boundary it entered at
    assert finish[2] == pytest.approx(second.t_join + 3 * step2, rel=0.02)


def test_lockstep_join_stalls_of_different_gpus_overlap_but_one_gpus_add_up() -> None:
    def stall_after(joins: list[int]) -> float:
        kernel, unit, states, _ = _unit(3)
        long = _req(0, gen_len=1000)
        kernel.call_at(0.0, lambda: unit.join(long, states[0]), 0)
        kernel.run(until_s=0.0)
        t = 10.3 * unit.step_s
        for i, gpu in enumerate(joins):
            req = _req(i + 1, gen_len=500)
            kernel.call_at(t, lambda r=req, g=gpu: unit.join(r, states[g], copied_tokens=32768), 0)
        kernel.run(until_s=t)
        # how far the counter is behind where an unstalled unit would be
        return 10.3 - unit.counter

    one = stall_after([1])
    assert one > 0
    assert stall_after([1, 2]) == pytest.approx(one)  # two GPUs in one step: the larger stall
    assert stall_after([1, 1]) == pytest.approx(2 * one, rel=0.05)  # one GPU: both stalls


def test_next_boundary_is_the_next_whole_step_or_now_when_idle() -> None:
    kernel, unit, (a, _), _ = _unit()
    assert unit.next_boundary_s(0.5) == 0.5  # idle
    kernel.call_at(0.0, lambda: unit.join(_req(1, gen_len=100), a), 0)
    kernel.run(until_s=0.0)
    step = unit.step_s
    assert unit.next_boundary_s(2.25 * step) == pytest.approx(3 * step)
    assert unit.next_boundary_s(3 * step) == pytest.approx(3 * step)
