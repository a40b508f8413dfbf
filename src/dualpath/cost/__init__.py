"""GPU cost models behind one Protocol: roofline, calibrated kernel tables, attention-time fit.

Public API: :class:`CostModel`, :func:`make_cost_model`, :data:`COST_MODEL_NAMES`,
:class:`CostConfig`, :class:`Efficiency`, :func:`model_traffic_bytes`,
:func:`weight_bytes_per_gpu`, :func:`fit_attention_predictor`, :func:`prefill_tokens_per_s`,
:func:`decode_tokens_per_s`. See docs/cost.md.
"""

from dualpath.cost.base import CostConfig, CostModel
from dualpath.cost.efficiency import DEFAULT_EFFICIENCY, Efficiency
from dualpath.cost.factory import COST_MODEL_NAMES, make_cost_model
from dualpath.cost.predictor import FittedAttentionPredictor, fit_attention_predictor
from dualpath.cost.rates import decode_tokens_per_s, prefill_tokens_per_s
from dualpath.cost.shapes import weight_bytes_per_gpu
from dualpath.cost.traffic import model_traffic_bytes

__all__ = [
    "COST_MODEL_NAMES",
    "DEFAULT_EFFICIENCY",
    "CostConfig",
    "CostModel",
    "Efficiency",
    "FittedAttentionPredictor",
    "fit_attention_predictor",
    "decode_tokens_per_s",
    "make_cost_model",
    "model_traffic_bytes",
    "prefill_tokens_per_s",
    "weight_bytes_per_gpu",
]
