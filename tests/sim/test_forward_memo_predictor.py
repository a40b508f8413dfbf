"""``sim.costs.ForwardMemoPredictor`` (compiled with the simulator) must equal the policy's
``ForwardAttentionPredictor`` over the same per-layer predictor, bit for bit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.policy import ForwardAttentionPredictor
from dualpath.sim.costs import CostCache, ForwardMemoPredictor
from dualpath.sim.harness.experiments import make_cluster

_cluster = make_cluster("deepseek-v3.2", "2p4d")
_costs = CostCache(_cluster.model_spec, _cluster.node_spec.gpu_spec, name="roofline", pe_ep_size=16,
                   de_ep_size=32, num_gpus_per_node=_cluster.node_spec.num_gpus)


@settings(max_examples=200, deadline=None)
@given(cached=st.integers(0, 200_000), new=st.integers(1, 20_000), flops=st.floats(0, 1e16))
def test_same_numbers_as_the_policy_predictor(cached: int, new: int, flops: float) -> None:
    layer = _costs.predictor
    ours = ForwardMemoPredictor(layer, _cluster.model_spec.num_layers)
    policy = ForwardAttentionPredictor(layer=layer, num_layers=_cluster.model_spec.num_layers)
    assert ours.attention_flops(cached, new) == policy.attention_flops(cached, new)
    assert ours.predict_s(flops) == policy.predict_s(flops)
