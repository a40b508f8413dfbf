"""dualpath.policy: the DualPath scheduler as pure decisions (spec section 8).

Drivers (the simulator, the runtime) keep their scheduling state in a :class:`Ledger`, read
frozen views from it, call a :class:`Scheduler` made by :func:`make_scheduler` in the shared
:class:`FetchOrder`, and apply the frozen plans back. See docs/policy.md.
"""

from dualpath.policy.batch import BatchLimits
from dualpath.policy.config import SchedulerConfig, derive_thresholds
from dualpath.policy.fetch import RUNTIME_ORDER, SIM_ORDER, Fetcher, FetchOrder
from dualpath.policy.ledger import Ledger, ViewBounds
from dualpath.policy.metrics import (
    attention_time_balance,
    bubble_fraction,
    max_over_avg,
    snic_traffic_balance,
)
from dualpath.policy.predictor import (
    AttentionFlops,
    AttentionTimePredictor,
    ForwardAttentionPredictor,
    LinearAttentionPredictor,
    causal_kv_sum,
    is_attention_predictor,
)
from dualpath.policy.scheduler import (
    POLICIES,
    POLICY_NAMES,
    PolicyScheduler,
    PolicySpec,
    Scheduler,
    make_scheduler,
)
from dualpath.policy.views import (
    BatchEntry,
    BatchItem,
    BatchPlan,
    BatchView,
    DecodeAssignment,
    DecodeFetchView,
    DecodePlan,
    EngineLoad,
    GroupLoad,
    GroupRouting,
    GroupTotal,
    NodeReadQueue,
    PendingPrefill,
    PrefillAssignment,
    PrefillFetchView,
    PrefillPlan,
    RequestInfo,
)

__all__ = [
    "POLICIES",
    "POLICY_NAMES",
    "RUNTIME_ORDER",
    "SIM_ORDER",
    "BatchLimits",
    "FetchOrder",
    "Fetcher",
    "Ledger",
    "ViewBounds",
    "AttentionFlops",
    "AttentionTimePredictor",
    "is_attention_predictor",
    "ForwardAttentionPredictor",
    "BatchEntry",
    "BatchItem",
    "BatchPlan",
    "BatchView",
    "DecodeAssignment",
    "DecodeFetchView",
    "DecodePlan",
    "EngineLoad",
    "GroupLoad",
    "GroupRouting",
    "GroupTotal",
    "LinearAttentionPredictor",
    "NodeReadQueue",
    "PendingPrefill",
    "PolicyScheduler",
    "PolicySpec",
    "PrefillAssignment",
    "PrefillFetchView",
    "PrefillPlan",
    "RequestInfo",
    "Scheduler",
    "SchedulerConfig",
    "attention_time_balance",
    "bubble_fraction",
    "causal_kv_sum",
    "derive_thresholds",
    "make_scheduler",
    "max_over_avg",
    "snic_traffic_balance",
]
