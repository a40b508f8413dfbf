"""ForwardAttentionPredictor: whole-forward attention time from a per-layer fit."""

from __future__ import annotations

import pytest

from dualpath.core.errors import ConfigError
from dualpath.cost import make_cost_model
from dualpath.policy import ForwardAttentionPredictor
from dualpath.spec.hardware import get_gpu
from dualpath.spec.models import get_model


def test_forward_is_num_layers_times_layer() -> None:
    model = get_model("deepseek-v3.2")
    layer = make_cost_model("roofline", get_gpu("h100")).attention_predictor(model)
    fwd = ForwardAttentionPredictor(layer=layer, num_layers=model.num_layers)
    flops_layer = layer.attention_flops(32768, 429)
    flops_fwd = fwd.attention_flops(32768, 429)
    assert flops_fwd == pytest.approx(model.num_layers * flops_layer)
    assert fwd.predict_s(flops_fwd) == pytest.approx(model.num_layers * layer.predict_s(flops_layer))
    # one agentic turn is far below a 300 ms per-forward quota only by a few x, not by 100x
    assert 0.3 / 20 < fwd.predict_s(flops_fwd) < 0.3


def test_bad_num_layers() -> None:
    layer = make_cost_model("roofline", get_gpu("h100")).attention_predictor(get_model("ds-27b"))
    with pytest.raises(ConfigError, match="num_layers"):
        ForwardAttentionPredictor(layer=layer, num_layers=0)
