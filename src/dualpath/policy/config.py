"""Scheduler configuration: thresholds alpha/beta, compute quota, batching mode, split block size.

alpha and beta are the open numbers of spec section 8; :func:`derive_thresholds` computes them from
rates the caller takes from ``dualpath.spec`` and a cost model, and every field can be overridden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dualpath.core.errors import require
from dualpath.policy.predictor import AttentionTimePredictor, is_attention_predictor
from dualpath.spec.clusters import DEFAULT_SIM_CLUSTER, get_cluster

BATCHING_MODES: tuple[str, ...] = ("quota", "tokens")
# The order a PE batch takes its waiting requests in (docs/policy.md, "PE batching"): "fifo" (spec
# section 8: assignment order) or "fresh-first" (requests this PE has not computed a chunk of yet
# first, then the chunked ones, each group FIFO: a long prompt cut by the quota then never makes the
# requests behind it wait for all of its chunks).
CHUNK_ORDERS: tuple[str, ...] = ("fresh-first", "fifo")
# Which PE groups a PE fetch may assign to (docs/policy.md, "PE scope"): "central" every live PE
# group (the central scheduler's choice over all PEs), "group" the fetching group's own PEs only.
PE_SCOPES: tuple[str, ...] = ("central", "group")
# Tie-breaks of spec section 8 (open there; docs/policy.md, "Tie-breaks"). READ_TIES: which side
# reads under ``shorter`` when the PE node's and the DE node's read queues are equal. PE_TIES: how
# least-loaded orders candidate PEs of equal ``tok_e``: "group" (group order, then rank order) or
# "read-queue" (the smaller node read queue first, then group order).
READ_TIES: tuple[str, ...] = ("pe", "de")
PE_TIES: tuple[str, ...] = ("group", "read-queue")


def check_scheduler_options(pe_scope: str | None, read_tie: str, pe_tie: str) -> None:
    """ConfigError naming a bad ``pe_scope`` (None: the policy's default) / ``read_tie`` /
    ``pe_tie``: one check for every config that carries them (this module's SchedulerConfig, the
    simulator's SimConfig, the runtime's scheduler service section)."""
    require(pe_scope is None or pe_scope in PE_SCOPES, "pe_scope", pe_scope,
            f"choices: {', '.join(PE_SCOPES)} (or None for the policy's default)")  # fmt: skip
    require(read_tie in READ_TIES, "read_tie", read_tie, f"choices: {', '.join(READ_TIES)}")
    require(pe_tie in PE_TIES, "pe_tie", pe_tie, f"choices: {', '.join(PE_TIES)}")


# Defaults for the paper's setting (used only when the caller does not derive its own), read from
# the paper's cluster preset: its node has one 400 Gbps SNIC (50e9 B/s); DeepSeek-V3.2 stores
# 40,016 KV bytes per token (656 B x 61 layers, spec section 1); a PE prefilled about 121k prompt
# tokens/s in the paper's offline DualPath run (2,048 agents x 157 turns / 5,429 s / 16 PEs x
# 32,721 mean context tokens).
_PAPER = get_cluster(DEFAULT_SIM_CLUSTER)
PAPER_SNIC_BYTES_PER_S = _PAPER.node_spec.snic_bytes_per_s
PAPER_KV_BYTES_PER_TOKEN = _PAPER.model_spec.kv_bytes_per_token
PAPER_PREFILL_TOKENS_PER_S = 121_000.0
COMPUTE_QUOTA_S = 0.3  # the paper's 300 ms compute quota per PE batch (one forward pass)
READ_WINDOW_S = 3.0  # alpha: tokens a node reads in 3 s
PREFILL_WINDOW_S = 5.0  # beta: tokens one GPU prefills in 5 s


def derive_thresholds(
    *,
    snic_bytes_per_s: float,
    kv_bytes_per_token: float,
    prefill_tokens_per_s: float,
    read_window_s: float = READ_WINDOW_S,
    prefill_window_s: float = PREFILL_WINDOW_S,
) -> tuple[int, int]:
    """Return ``(alpha_tokens, beta_tokens)``.

    alpha = tokens one node's SNICs read in ``read_window_s`` (``snic_bytes_per_s`` is the node's
    total storage read rate); beta = prompt tokens one GPU prefills in ``prefill_window_s``
    (``prefill_tokens_per_s`` counts ``prompt_len`` tokens, cached + new, at the workload's hit
    rate, because PE ``tok_e`` counts prompt tokens).
    """
    require(snic_bytes_per_s > 0, "snic_bytes_per_s", snic_bytes_per_s, "must be > 0")
    require(kv_bytes_per_token > 0, "kv_bytes_per_token", kv_bytes_per_token, "must be > 0")
    require(prefill_tokens_per_s > 0, "prefill_tokens_per_s", prefill_tokens_per_s, "must be > 0")
    require(read_window_s > 0, "read_window_s", read_window_s, "must be > 0")
    require(prefill_window_s > 0, "prefill_window_s", prefill_window_s, "must be > 0")
    alpha = int(read_window_s * snic_bytes_per_s / kv_bytes_per_token)
    beta = int(prefill_window_s * prefill_tokens_per_s)
    return max(alpha, 1), max(beta, 1)


class _NodeRates(Protocol):
    @property
    def snic_bytes_per_s(self) -> float: ...


class _ModelKV(Protocol):
    @property
    def kv_bytes_per_token(self) -> int: ...


_DEFAULT_ALPHA, _DEFAULT_BETA = derive_thresholds(
    snic_bytes_per_s=PAPER_SNIC_BYTES_PER_S,
    kv_bytes_per_token=PAPER_KV_BYTES_PER_TOKEN,
    prefill_tokens_per_s=PAPER_PREFILL_TOKENS_PER_S,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """Knobs of every policy. Validated on construction; no I/O.

    alpha_tokens: a PE node with ``read_q > alpha`` is class C3 (read-congested).
    beta_tokens: a PE with ``tok_e > beta`` is class C1 (overloaded, never chosen).
    compute_quota_s: cap on a PE batch's predicted attention time over one forward pass, all layers
      (the paper's 300 ms). The predictor defines the scope: give one that predicts whole-forward
      time (e.g. ``ForwardAttentionPredictor``); a per-layer one packs 30-60x larger batches.
    hbm_slack: the 1.05 factor of Z in DE phase 2.
    block_size: KV block size in tokens; split reads cut at whole blocks.
    batching: "quota" (compute quota, needs ``attention_predictor``) or "tokens" (FIFO up to
      ``max_batch_tokens`` new tokens); None = the policy's default (dualpath*: quota, others: tokens).
    max_batch_tokens: token budget of "tokens" batching (ignored by "quota").
    pe_scope: "central" (a PE fetch's candidates are every live PE group's engines) or "group"
      (only the fetching group's: strict leader fetch); None = the policy's default ("group" for
      every registered policy; docs/policy.md, "PE scope").
    read_tie: the side that reads under the ``shorter`` read rule when the PE node's and the DE
      node's read queues are equal: "pe" (default) or "de" (``READ_TIES``; docs/policy.md,
      "Tie-breaks").
    pe_tie: how ``least-loaded`` orders candidate PEs of equal ``tok_e`` (within a class): "group"
      (default: group order, then rank order) or "read-queue" (the smaller node ``read_q`` first,
      then group order; only central PE fetches, whose candidates span nodes, can differ).
    attention_predictor: the PE attention-time predictor (see predictor.py).
    chunk_order: "fresh-first" (default) or "fifo" (``CHUNK_ORDERS``): which waiting requests a PE
      batch offers first; only items marked ``started`` (a chunk computed already) differ.
    """

    alpha_tokens: int = _DEFAULT_ALPHA
    beta_tokens: int = _DEFAULT_BETA
    compute_quota_s: float = COMPUTE_QUOTA_S
    hbm_slack: float = 1.05
    block_size: int = 64
    batching: str | None = None
    max_batch_tokens: int = 16_384
    pe_scope: str | None = None
    read_tie: str = "pe"
    pe_tie: str = "group"
    attention_predictor: AttentionTimePredictor | None = None
    chunk_order: str = "fresh-first"

    def __post_init__(self) -> None:
        require(self.alpha_tokens >= 0, "alpha_tokens", self.alpha_tokens, "must be >= 0")
        require(self.beta_tokens >= 0, "beta_tokens", self.beta_tokens, "must be >= 0")
        require(self.compute_quota_s > 0, "compute_quota_s", self.compute_quota_s, "must be > 0")
        require(self.hbm_slack >= 1.0, "hbm_slack", self.hbm_slack, "must be >= 1.0")
        require(self.block_size > 0, "block_size", self.block_size, "must be > 0")
        require(
            self.batching is None or self.batching in BATCHING_MODES,
            "batching",
            self.batching,
            f"choices: {', '.join(BATCHING_MODES)} (or None for the policy default)",
        )
        check_scheduler_options(self.pe_scope, self.read_tie, self.pe_tie)
        require(self.max_batch_tokens > 0, "max_batch_tokens", self.max_batch_tokens, "must be > 0")
        require(self.chunk_order in CHUNK_ORDERS, "chunk_order", self.chunk_order,
                f"choices: {', '.join(CHUNK_ORDERS)}")  # fmt: skip
        pred = self.attention_predictor
        require(
            pred is None or is_attention_predictor(pred),
            "attention_predictor",
            pred,
            "must have attention_flops(cached_len, new_len) and predict_s(flops)",
        )

    @classmethod
    def from_rates(
        cls,
        *,
        snic_bytes_per_s: float,
        kv_bytes_per_token: float,
        prefill_tokens_per_s: float,
        **overrides: Any,
    ) -> SchedulerConfig:
        """Config with alpha/beta derived by :func:`derive_thresholds`; ``overrides`` win
        (including explicit ``alpha_tokens`` / ``beta_tokens``)."""
        alpha, beta = derive_thresholds(
            snic_bytes_per_s=snic_bytes_per_s,
            kv_bytes_per_token=kv_bytes_per_token,
            prefill_tokens_per_s=prefill_tokens_per_s,
        )
        fields: dict[str, Any] = {"alpha_tokens": alpha, "beta_tokens": beta}
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def for_node(
        cls, node: _NodeRates, model: _ModelKV, *, prefill_tokens_per_s: float, **overrides: Any
    ) -> SchedulerConfig:
        """Config for a ``dualpath.spec`` node and model (alpha from the node's SNICs and the
        model's KV bytes per token); ``prefill_tokens_per_s`` comes from a cost model."""
        return cls.from_rates(
            snic_bytes_per_s=node.snic_bytes_per_s,
            kv_bytes_per_token=model.kv_bytes_per_token,
            prefill_tokens_per_s=prefill_tokens_per_s,
            **overrides,
        )
