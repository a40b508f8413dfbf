"""How an engine's KV budget is split into its pools: the one rule the runtime allocates by
(``runtime/cluster/memory.py``, ``--kv-cache-memory``) and the simulated local cluster sizes its
engines by (``sim/local.py``), so the two cannot drift apart.

``auto`` (``--kv-cache-memory``'s default) is the smaller of ``AUTO_POOL_BYTES`` and
``AUTO_POOL_TOKENS`` tokens of the model's KV: a 1P2D SmolLM2-135M cluster with its standby then
fits 6 GB (benchmarks/serve_memory.py), and a tiny test model takes a few MiB.

The budget covers everything KV an engine allocates: a decode engine's paged cache and its buffer
(prompts whose KV the prefill engine is sending), ``DE_BUFFER_SHARE`` of the budget for the buffer;
a prefill engine's buffer (each prompt's KV while it is prefilled) and its two layer staging slots
(``PE_STAGING_SHARE``, at least one full-context request, at most ``MAX_STAGING_TOKENS`` per slot).
``KVPools`` says what that holds: the longest prompt and context a request may have; the scheduler
refuses longer ones with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpath.core.errors import ConfigError
from dualpath.core.units import GiB

AUTO_POOL_BYTES = 1 * GiB  # per engine; with 3 engines + standby SmolLM2 fits 6 GB (docs/server.md)
AUTO_POOL_TOKENS = 65536  # per engine; the earlier decode_hbm_tokens default (caps small models)
DE_BUFFER_SHARE = 0.5  # of a DE's budget: its buffer; the rest is the paged cache
PE_STAGING_SHARE = 1 / 8  # of a PE's budget: its two staging slots (one layer each); the rest: buffer
MAX_STAGING_TOKENS = 65536  # per staging slot (a batch's cached + new tokens of one layer)
STAGING_SLOTS = 2  # the layer being computed and the next one being loaded


def auto_budget_bytes(kv_bytes_per_token: int) -> int:
    """One engine's budget under ``--kv-cache-memory auto`` for a model of ``kv_bytes_per_token``."""
    return min(AUTO_POOL_BYTES, AUTO_POOL_TOKENS * kv_bytes_per_token)


@dataclass(frozen=True, slots=True, kw_only=True)
class KVPools:
    """What one engine allocates for KV (blocks of ``block_bytes``; staging in tokens per slot)."""

    role: str
    budget_bytes: int
    block_size: int
    block_bytes: int  # a Full Block: every layer of ``block_size`` tokens
    token_layer_bytes: int  # one token of one layer (a staging row)
    cache_blocks: int = 0  # DE paged cache
    buffer_blocks: int = 0  # DE / PE buffer
    staging_tokens: int = 0  # PE, per slot

    @property
    def total_bytes(self) -> int:
        staging = STAGING_SLOTS * self.staging_tokens * self.token_layer_bytes
        return (self.cache_blocks + self.buffer_blocks) * self.block_bytes + staging

    @property
    def buffer_bytes(self) -> int:
        return self.buffer_blocks * self.block_bytes

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt this engine can hold (buffer; a PE's staging too)."""
        n = self.buffer_blocks * self.block_size
        return min(n, self.staging_tokens) if self.role == "prefill" else n

    @property
    def max_context_tokens(self) -> int:
        """Prompt + generated tokens one request may reach here (a DE's cache; a PE: its prompt).
        A DE's is also what the scheduler books it for (``EngineHello.hbm_tokens``)."""
        return self.cache_blocks * self.block_size if self.role == "decode" else self.max_prompt_tokens

    def describe(self) -> str:
        mib = 1 << 20
        parts = (
            [f"paged cache {self.cache_blocks * self.block_bytes / mib:.0f} MiB "
             f"({self.cache_blocks * self.block_size} tokens)"]
            if self.role == "decode"
            else [f"staging {STAGING_SLOTS} x {self.staging_tokens} tokens of one layer "
                  f"({STAGING_SLOTS * self.staging_tokens * self.token_layer_bytes / mib:.0f} MiB)"]
        )  # fmt: skip
        parts.append(f"buffer {self.buffer_blocks * self.block_bytes / mib:.0f} MiB "
                     f"({self.buffer_blocks * self.block_size} tokens)")  # fmt: skip
        return f"KV pool {self.total_bytes / mib:.0f} MiB of a {self.budget_bytes / mib:.0f} MiB budget: " + (
            ", ".join(parts)
        )


def size_pools(
    role: str, budget_bytes: int, *, block_size: int, block_bytes: int, num_layers: int, max_context: int
) -> KVPools:
    """Split ``budget_bytes`` (see module docstring); ConfigError when it holds less than one block
    of each pool. ``max_context``: the model's longest context (0: unknown, the share alone)."""
    token_layer = block_bytes // (block_size * num_layers)
    if role == "decode":
        buffer = int(budget_bytes * DE_BUFFER_SHARE) // block_bytes
        cache = (budget_bytes - buffer * block_bytes) // block_bytes
        pools = KVPools(role=role, budget_bytes=budget_bytes, block_size=block_size, block_bytes=block_bytes,
                        token_layer_bytes=token_layer, cache_blocks=cache, buffer_blocks=buffer)  # fmt: skip
    else:
        full = -(-max_context // block_size) * block_size
        share = int(budget_bytes * PE_STAGING_SHARE) // (STAGING_SLOTS * token_layer)
        staging = min(max(share, full), MAX_STAGING_TOKENS, budget_bytes // (2 * STAGING_SLOTS * token_layer))
        buffer = (budget_bytes - STAGING_SLOTS * staging * token_layer) // block_bytes
        pools = KVPools(role=role, budget_bytes=budget_bytes, block_size=block_size, block_bytes=block_bytes,
                        token_layer_bytes=token_layer, buffer_blocks=buffer, staging_tokens=staging)  # fmt: skip
    if (
        pools.buffer_blocks < 1
        or (role == "decode" and pools.cache_blocks < 1)
        or pools.max_prompt_tokens < 1
    ):
        raise ConfigError(
            "kv_cache_memory", budget_bytes, f"a {role} engine needs at least {2 * block_bytes} bytes "
            f"(one {block_size}-token block of KV of each pool)",
        )  # fmt: skip
    return pools
