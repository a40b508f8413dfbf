"""Fast, memoised access to a ``dualpath.cost`` model for the simulator's hot loops.

The step times are the cost model's as is: by default ``calibrated``, the measured kernel tables
(cost/calibrated.py: GEMM, MLA / attention, MoE per GPU, interpolated over their grids, the
roofline only for an op no table covers, each op's source in ``describe()["coverage"]``): a data
folder's tables, else the ones the package bundles (H100/H200/B200), ``source`` says which. For
a GPU with neither the roofline model runs instead and ``source`` says why. No per-token multiplier: the fixed costs the kernels leave out are added as
stated times (sim/calibration.py): per PE iteration / DE step the host overhead, and per MoE layer
the EP all-to-all latency floor: a DE step's (DeepEP's low-latency kernels, pure RDMA) for any EP
group, a PE iteration's over RDMA when its group spans nodes, NVLink inside one; a DE step also
pays its all-to-all bytes over DeepEP's published low-latency bandwidths per token of the GPU's
batch (sim/ep_comm.py).

A PE iteration's layer time is ``attention(batch) + other(tokens)``: attention from the cost
model's attention predictor (the same FLOPs -> seconds map the scheduler's quota uses), the rest
(GEMMs, MoE, norms) from ``prefill_layer_times_s`` of a zero-context batch with the same number of
new tokens, memoised per 16-token bucket. A decode step is memoised per (batch size, mean context
bucketed to 1,024 tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dualpath.core.errors import ConfigError
from dualpath.cost import make_cost_model, model_traffic_bytes
from dualpath.sim.calibration import DEFAULT_CALIBRATION, Calibration
from dualpath.sim.ep_comm import (
    DEEPEP_MEASURED_CNIC_GBPS,
    decode_a2a_bytes_s_per_token,
    decode_cnic_bytes_per_token,
)

_TOKEN_BUCKET: Final = 16
_CTX_BUCKET: Final = 1024
_MEMO_LIMIT: Final = 1 << 20  # entries kept by MemoAttentionPredictor before it starts afresh


class MemoAttentionPredictor:
    """A per-layer attention predictor: the wrapped cost-model predictor's numbers, cheaper.

    For a ``FittedAttentionPredictor`` (cost/predictor.py) of a uniform model (no sliding windows,
    no compressed layers: ``cost.shapes.is_uniform``) ``attention_flops`` is that predictor's
    closed form (``cost.shapes.attention_flops_split`` over ``spec.causal_kv_sum``: the same
    integer and float operations in the same order, so the same bits) compiled with the simulator,
    and ``predict_s`` its line: no dict, no interpreted call. The batch planner's binary search
    and the simulator's layer times ask for ~1M distinct spans in a large run, so the earlier
    ``(cached, new)`` memo grew to its limit and its lookups missed the caches. Any other predictor
    is memoised per ``(cached, new)`` (the function is pure). ``tests/sim/
    test_forward_predictor_memo.py`` holds both forms equal to the wrapped predictor. Satisfies
    ``dualpath.policy.AttentionTimePredictor``."""

    __slots__ = (
        "layer",
        "_flops",
        "_closed",
        "_top_k",
        "_indexer",
        "_pair_flops",
        "_indexer_pair_flops",
        "_indexer_weight",
        "_intercept_s",
        "_s_per_flop",
        "_predict",
    )

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self._flops: dict[tuple[int, int], float] = {}
        self._predict: Callable[[float], float] = layer.predict_s
        model: Any = getattr(layer, "model", None)
        from dualpath.cost.predictor import FittedAttentionPredictor
        from dualpath.cost.shapes import is_uniform

        self._closed = type(layer) is FittedAttentionPredictor and model is not None and is_uniform(model)
        self._top_k = -1
        self._indexer = False
        self._pair_flops = 0.0
        self._indexer_pair_flops = 0.0
        self._indexer_weight = 0.0
        self._intercept_s = 0.0
        self._s_per_flop = 0.0
        if self._closed:
            top_k = model.sparse_top_k
            self._top_k = -1 if top_k is None else int(top_k)
            self._indexer = bool(model.index_num_heads)
            self._pair_flops = float(model.attention_flops_per_pair)
            self._indexer_pair_flops = float(model.indexer_flops_per_pair)
            self._indexer_weight = float(layer.indexer_weight)
            self._intercept_s = float(layer.intercept_s)
            self._s_per_flop = float(layer.seconds_per_flop)

    def attention_flops(self, cached_len: int, new_len: int) -> float:
        if not self._closed or cached_len < 0 or new_len < 0:  # (the wrapped one raises on < 0)
            return self._memo(cached_len, new_len)
        n, c = new_len, cached_len
        if n <= 0:
            pairs = keys = 0
        else:
            keys = n * c + n * (n + 1) // 2  # causal_kv_sum(c, n): uncapped
            cap = self._top_k
            if cap < 0:
                pairs = keys
            else:  # causal_kv_sum(c, n, cap)
                m = cap - c
                if n < m:
                    m = n
                if m < 0:
                    m = 0
                pairs = m * c + m * (m + 1) // 2 + (n - m) * cap
        flops = pairs * self._pair_flops  # ModelSpec.attention_flops_layer
        if not self._indexer:
            return flops + self._indexer_weight * 0.0  # attention_flops_split: (total, 0.0)
        indexer = keys * self._indexer_pair_flops
        flops += indexer
        return (flops - indexer) + self._indexer_weight * indexer

    def _memo(self, cached_len: int, new_len: int) -> float:
        key = (cached_len, new_len)
        value = self._flops.get(key)
        if value is None:
            if len(self._flops) >= _MEMO_LIMIT:
                self._flops.clear()
            value = self._flops[key] = self.layer.attention_flops(cached_len, new_len)
        return value

    def predict_s(self, flops: float) -> float:
        if not self._closed:
            return self._predict(flops)
        if flops <= 0:  # FittedAttentionPredictor.predict_s
            return 0.0
        return self._intercept_s + self._s_per_flop * flops


class CostCache:
    pe_cost: Any
    de_cost: Any
    predictor: MemoAttentionPredictor
    source: str
    _prefill_fixed_s: float
    _decode_fixed_s: float
    _decode_a2a_s_per_token: float
    _other: list[float]
    _decode: list[list[float]]
    _traffic_pe: float
    _traffic_de: float

    def __init__(
        self,
        model: Any,
        gpu: Any,
        *,
        name: str,
        pe_ep_size: int,
        de_ep_size: int,
        num_gpus_per_node: int,
        cal: Calibration = DEFAULT_CALIBRATION,
        tp_size: int = 1,
        cnic_gbps: float = DEEPEP_MEASURED_CNIC_GBPS,
    ) -> None:
        """``name``: a ``dualpath.cost`` model, or ``auto``: ``calibrated`` if its tables can be
        read, else the roofline (``source`` says which and why). ``tp_size`` > 1: ``gpu`` is a TP
        group seen as one engine (sim/cluster.py); the kernel tables are per GPU, so such an engine
        runs the roofline (said in ``source``). ``cnic_gbps``: one GPU's compute NIC, which scales
        DeepEP's published all-to-all bandwidths (sim/ep_comm.py)."""
        self.model = model
        self.cal = cal
        # fixed costs the load path and the decode units charge (sim/calibration.py)
        self.pd_handoff_s: float = cal.pd_handoff_s
        self.layer_handoff_s: float = cal.pd_layer_handoff_s * model.num_layers
        self._join_s = cal.decode_join_s
        self._copy_s_per_token = model.kv_bytes_per_token / gpu.mem_bytes_per_s
        self.num_layers: int = model.num_layers
        self._choose_models(name, model, gpu, pe_ep_size, de_ep_size, num_gpus_per_node, tp_size)
        self._fixed_costs(model, pe_ep_size, de_ep_size, num_gpus_per_node, cnic_gbps)

    def _choose_models(
        self,
        name: str,
        model: Any,
        gpu: Any,
        pe_ep_size: int,
        de_ep_size: int,
        num_gpus_per_node: int,
        tp_size: int,
    ) -> None:
        """Both roles' cost models by ``name`` (auto: calibrated, else the roofline; a TP engine:
        the roofline), and ``source``: which one and why."""
        auto = name == "auto"
        if auto:
            name = "calibrated"
        self.source = name
        if tp_size > 1 and name != "roofline":
            self.source = (
                f"roofline ({name} not used: its kernel tables are per GPU and a TP-{tp_size} engine"
                " is modelled as one GPU of the group's resources)"
            )
            name = "roofline"
        try:
            self._make(name, model, gpu, pe_ep_size, de_ep_size, num_gpus_per_node)
        except ConfigError as exc:  # auto: no kernel tables (or no pyarrow to read them)
            if not auto:
                raise
            self.source = f"roofline (auto: {name} unavailable: {exc})"
            self._make("roofline", model, gpu, pe_ep_size, de_ep_size, num_gpus_per_node)
        tables = getattr(self.pe_cost, "tables", None)
        if tables is not None:  # the kernel tables' origin: the bundled archive or a data folder
            self.source = f"{self.source} ({tables.origin})"

    def _fixed_costs(
        self, model: Any, pe_ep_size: int, de_ep_size: int, num_gpus_per_node: int, cnic_gbps: float
    ) -> None:
        """The per-iteration fixed costs, the decode all-to-all per token, the model traffic per
        token, and the empty memos."""
        cal = self.cal
        moe_layers = model.num_moe_layers
        self._prefill_fixed_s = cal.prefill_iter_overhead_s + moe_layers * _ep_latency_s(
            pe_ep_size, num_gpus_per_node, cal
        )
        # decode runs DeepEP's low-latency kernels (pure RDMA, every peer, in the node too): the
        # engine's exchange floor and, per token of the GPU's batch, its dispatch + combine bytes
        # over DeepEP's published low-latency bandwidth at the group's size, every MoE layer
        # (sim/ep_comm.py), whether or not the EP group spans nodes
        self._decode_fixed_s = cal.decode_step_overhead_s + moe_layers * _ep_latency_s(
            de_ep_size, num_gpus_per_node, cal, low_latency=True
        )
        self._decode_a2a_s_per_token = moe_layers * decode_a2a_bytes_s_per_token(model, de_ep_size, cnic_gbps)
        # memos as lists (a list index is far cheaper than a dict lookup in the compiled build);
        # -1.0 marks a value not computed yet
        self._other = []  # by 16-token bucket
        self._decode = []  # by batch size, then by context bucket
        self._traffic_pe = model_traffic_bytes(
            model, 1, ep_size=pe_ep_size, num_gpus_per_node=num_gpus_per_node
        )
        # decode runs DeepEP's low-latency kernels: every remote selection crosses the CNIC
        self._traffic_de = decode_cnic_bytes_per_token(model, de_ep_size, num_gpus_per_node)

    def _make(self, name: str, model: Any, gpu: Any, pe_ep: int, de_ep: int, gpn: int) -> None:
        """Both roles' cost models and the attention predictor; the tables are read here (a
        missing table raises now, not in the middle of a run)."""
        self.pe_cost = make_cost_model(name, gpu, ep_size=pe_ep, num_gpus_per_node=gpn)
        self.de_cost = make_cost_model(name, gpu, ep_size=de_ep, num_gpus_per_node=gpn)
        self.predictor = MemoAttentionPredictor(self.pe_cost.attention_predictor(model))
        self.pe_cost.prefill_layer_times_s(model, [(0, _TOKEN_BUCKET)])
        self.de_cost.decode_step_time_s(model, [_CTX_BUCKET])

    def attention_layer_s(self, entries: list[tuple[int, int]]) -> float:
        """Predicted attention seconds of one layer for ``(cached_len, new_len)`` entries."""
        pred = self.predictor
        flops = 0.0
        for cached, new in entries:
            flops += pred.attention_flops(cached, new)
        return pred.predict_s(flops) if flops > 0 else 0.0

    def other_layer_s(self, num_tokens: int) -> float:
        """Non-attention seconds of one prefill layer for ``num_tokens`` new tokens on one GPU."""
        if num_tokens <= 0:
            return 0.0
        key = -(-num_tokens // _TOKEN_BUCKET)
        memo = self._other
        if key < len(memo):
            value = memo[key]
            if value >= 0.0:
                return value
        else:
            memo.extend([-1.0] * (key + 1 - len(memo)))
        value = self.pe_cost.prefill_layer_times_s(self.model, [(0, key * _TOKEN_BUCKET)])[1]
        memo[key] = value
        return value

    def iteration_s(self, layer_s: float) -> float:
        """Whole-iteration time from the (group-synchronised) per-layer time."""
        return layer_s * self.num_layers + self._prefill_fixed_s

    def decode_step_s(self, batch_size: int, ctx_sum: float) -> float:
        """Seconds of one decode step of one GPU holding ``batch_size`` requests."""
        if batch_size <= 0:
            return 0.0
        ctx = int(ctx_sum / batch_size) // _CTX_BUCKET
        rows = self._decode
        if batch_size >= len(rows):
            rows.extend([[] for _ in range(batch_size + 1 - len(rows))])
        row = rows[batch_size]
        if ctx < len(row):
            value = row[ctx]
            if value >= 0.0:
                return value
        else:
            row.extend([-1.0] * (ctx + 1 - len(row)))
        lens = [ctx * _CTX_BUCKET + _CTX_BUCKET // 2] * batch_size
        value = (
            self.de_cost.decode_step_time_s(self.model, lens)
            + self._decode_fixed_s
            + batch_size * self._decode_a2a_s_per_token
        )
        row[ctx] = value
        return value

    def describe(self) -> dict[str, object]:
        """Which cost model ran (and why the roofline, if it did), per role, with table coverage."""
        return {
            "source": self.source,
            "prefill": self.pe_cost.describe(),
            "decode": self.de_cost.describe(),
            "prefill_fixed_s": self._prefill_fixed_s,
            "decode_fixed_s": self._decode_fixed_s,
            "decode_a2a_s_per_token": self._decode_a2a_s_per_token,
        }

    def decode_terms_s(self, batch_size: int, context_len: int) -> dict[str, float]:
        """One decode step of one GPU with ``batch_size`` requests of ``context_len`` tokens, by
        term (seconds; they sum to :meth:`decode_step_s`'s value up to its context bucketing):
        attention, dense GEMMs, routed experts, the EP all-to-all floor and its bytes, overhead."""
        model, de = self.model, self.de_cost
        lens = [context_len] * batch_size
        layers = model.num_layers
        attention = layers * de.decode_attention_layer_s(model, lens)
        dense = layers * de.dense_op_s(model, batch_size)
        moe = layers * de.moe_op_s(model, batch_size * de.config.ep_size)
        overhead = self.cal.decode_step_overhead_s
        return {
            "attention": attention,
            "dense": dense,
            "moe": moe,
            "a2a_floor": self._decode_fixed_s - overhead,
            "a2a_bytes": batch_size * self._decode_a2a_s_per_token,
            "overhead": overhead,
        }

    def join_stall_s(self, copied_tokens: int) -> float:
        """How long a request joining a decode batch stalls it: the engine's admission plus the
        DE-buffer -> HBM copy's HBM writes (``copied_tokens`` of KV at the HBM bandwidth)."""
        return self._join_s + copied_tokens * self._copy_s_per_token

    def pe_model_bytes(self, num_tokens: int) -> float:
        """EP all-to-all bytes one PE GPU sends (and receives) for ``num_tokens`` tokens."""
        return self._traffic_pe * num_tokens

    def de_model_bytes(self, num_tokens: int) -> float:
        return self._traffic_de * num_tokens


def _ep_latency_s(ep_size: int, num_gpus_per_node: int, cal: Calibration, low_latency: bool = False) -> float:
    """Per-MoE-layer EP all-to-all latency of a group of ``ep_size`` GPUs (0 without EP): the
    low-latency kernels' (decode) floor for any group; the normal kernels' (prefill) floor over
    RDMA for a group spanning nodes, over NVLink inside one."""
    if ep_size <= 1:
        return 0.0
    if low_latency or ep_size > num_gpus_per_node:
        return cal.ep_layer_latency_rdma_s
    return cal.ep_layer_latency_nvlink_s


class ProfileCosts(CostCache):
    """The cost cache of a measured engine profile (``spec/engine_profile.py``, read by ``cost/profile.py``; ``--device profile:FILE``):
    a PE iteration is the profile's prefill step of its batch, a DE step the profile's decode step
    of its batch and mean context, a join the profile's measured admission of a prefilled prompt;
    the fixed costs are the calibration's (zero for the local cluster, whose engine loops are
    inside the measured steps). The quota batcher's attention line is the one the profiled engine
    measured, so the simulated PE batches as the real one does. A unit of one engine computes
    ``iteration_s(attention_layer_s + other_layer_s)``, i.e. ``ProfileTimes.prefill_s``, split per
    layer as the units read it."""

    def __init__(self, profile: Any, cal: Calibration) -> None:
        from dualpath.cost.profile import ProfileTimes
        from dualpath.policy import AttentionFlops, LinearAttentionPredictor

        self.model = None
        self.cal = cal
        self.times = times = ProfileTimes(profile)
        self.num_layers = profile.num_layers
        self.pd_handoff_s = cal.pd_handoff_s
        self.layer_handoff_s = cal.pd_layer_handoff_s * profile.num_layers
        self._join_s = cal.decode_join_s
        self.source = f"profile ({profile.model}, {profile.dtype}, {profile.host or 'unknown host'})"
        flops = AttentionFlops(
            num_heads=profile.num_heads, qk_head_dim=profile.head_dim, v_head_dim=profile.head_dim
        )
        line = LinearAttentionPredictor(
            flops_model=flops,
            seconds_per_flop=profile.attention_s_per_gflop / 1e9,
            intercept_s=profile.attention_intercept_s / profile.num_layers,
        )
        self.predictor = MemoAttentionPredictor(line)
        self._prefill_fixed_s = cal.prefill_iter_overhead_s
        self._decode_fixed_s = cal.decode_step_overhead_s
        self._decode_a2a_s_per_token = 0.0
        self._traffic_pe = 0.0
        self._traffic_de = 0.0
        self._other = []
        self._decode = []
        self._layers_f = float(profile.num_layers)
        self._request_s = float(profile.prefill_request_s)
        self._zero = times.prefill_zero_s
        self._cached = times.prefill_cached_s

    def attention_layer_s(self, entries: list[tuple[int, int]]) -> float:
        """What the entries' cached prefixes, and every request beyond the first, add to the
        step, per layer."""
        cached = self._cached
        total = 0.0
        for c, n in entries:
            total += cached(c, n)
        if len(entries) > 1:
            total += (len(entries) - 1) * self._request_s
        return total / self._layers_f

    def other_layer_s(self, num_tokens: int) -> float:
        """The zero-cache step of ``num_tokens`` new tokens, per layer."""
        return self._zero(num_tokens) / self._layers_f if num_tokens > 0 else 0.0

    def iteration_s(self, layer_s: float) -> float:
        return layer_s * self._layers_f + self._prefill_fixed_s

    def decode_step_s(self, batch_size: int, ctx_sum: float) -> float:
        if batch_size <= 0:
            return 0.0
        return self.times.decode_step_s(batch_size, ctx_sum / batch_size) + self._decode_fixed_s

    def join_stall_s(self, copied_tokens: int) -> float:
        """The profile's admission of a prefilled prompt of ``copied_tokens`` tokens."""
        return self._join_s + self.times.join_s(copied_tokens)

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "prefill_fixed_s": self._prefill_fixed_s,
            "decode_fixed_s": self._decode_fixed_s,
        }

    def decode_terms_s(self, batch_size: int, context_len: int) -> dict[str, float]:
        step = self.times.decode_step_s(batch_size, context_len)
        return {"measured": step, "overhead": self._decode_fixed_s}
