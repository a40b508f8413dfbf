"""The simulator hands the policy the policy's own ``ForwardAttentionPredictor`` over its memoised
per-layer predictor (no copy of the arithmetic), and the memo gives the unmemoised numbers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.policy import ForwardAttentionPredictor
from dualpath.sim.config import SimConfig, get_system
from dualpath.sim.driver import Simulation
from dualpath.sim.harness.experiments import make_cluster

_cluster = make_cluster("deepseek-v3.2", "2p4d")
_sim = Simulation(SimConfig(cluster=_cluster, system=get_system("dualpath")), [])


def test_the_scheduler_gets_the_policy_predictor_over_the_memo() -> None:
    pred = _sim.adapter.scheduler.config.attention_predictor
    assert type(pred) is ForwardAttentionPredictor
    assert pred.layer is _sim.costs.predictor
    assert pred.num_layers == _cluster.model_spec.num_layers


@settings(max_examples=200, deadline=None)
@given(cached=st.integers(0, 200_000), new=st.integers(1, 20_000), flops=st.floats(0, 1e16))
def test_memo_gives_the_cost_models_numbers(cached: int, new: int, flops: float) -> None:
    memo = _sim.costs.predictor
    layer = memo.layer  # the cost model's own predictor
    assert memo.attention_flops(cached, new) == layer.attention_flops(cached, new)
    assert memo.attention_flops(cached, new) == layer.attention_flops(cached, new)  # a hit
    assert memo.predict_s(flops) == layer.predict_s(flops)
