"""Block geometry and chain hashing.

A Full Block holds ``block_size`` tokens of KV for every layer, laid out ``[layers, block_size,
kv_bytes_per_token_layer]``; the Layer Block of layer ``i`` is the contiguous byte range
``[i * layer_block_bytes, (i + 1) * layer_block_bytes)`` of it. Blocks are addressed by a chain hash
of (parent block hash, this block's token ids), so a hash names a whole prefix (a trie node).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dualpath.core.errors import require

HASH_BYTES = 16  # blake2b digest size; hashes are the hex form (32 characters)
HASH_HEX_LEN = 2 * HASH_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockLayout:
    """Shape of a Full Block in bytes. The engine knows dtype and head shapes; the store sees bytes."""

    num_layers: int
    kv_bytes_per_token_layer: int
    block_size: int = 64

    def __post_init__(self) -> None:
        require(self.num_layers >= 1, "num_layers", self.num_layers, "must be >= 1")
        require(self.block_size >= 1, "block_size", self.block_size, "must be >= 1")
        require(
            self.kv_bytes_per_token_layer >= 1,
            "kv_bytes_per_token_layer",
            self.kv_bytes_per_token_layer,
            "must be >= 1",
        )

    @property
    def layer_block_bytes(self) -> int:
        """Bytes of one Layer Block: ``block_size * kv_bytes_per_token_layer``."""
        return self.block_size * self.kv_bytes_per_token_layer

    @property
    def full_block_bytes(self) -> int:
        """Bytes of one Full Block (all layers)."""
        return self.num_layers * self.layer_block_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers."""
        return self.num_layers * self.kv_bytes_per_token_layer

    def layer_range(self, layer: int) -> tuple[int, int]:
        """Byte range ``(start, stop)`` of ``layer``'s Layer Block inside a Full Block."""
        require(0 <= layer < self.num_layers, "layer", layer, f"must be in [0, {self.num_layers})")
        start = layer * self.layer_block_bytes
        return start, start + self.layer_block_bytes

    def layer_view(self, full_block: np.ndarray, layer: int) -> np.ndarray:
        """The Layer Block of ``layer`` inside a Full Block's uint8 array (a view, no copy)."""
        start, stop = self.layer_range(layer)
        return full_block[start:stop]


def _is_hash(value: object) -> bool:
    if not isinstance(value, str) or len(value) != HASH_HEX_LEN:
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


def check_hash(value: object, key: str = "block_hash") -> str:
    """Return ``value`` if it is a block hash (32 lowercase hex characters), else raise ConfigError."""
    require(_is_hash(value) and value == str(value).lower(), key, value, "not a 32-hex-digit block hash")
    return str(value)


def block_hash(parent_hash: str | None, token_ids: Sequence[int] | np.ndarray) -> str:
    """Chain hash of one block: blake2b-128 over the parent's digest and the token ids as LE int64.

    Stable across processes and machines (no Python ``hash``). ``parent_hash`` None is the root.
    """
    h = hashlib.blake2b(digest_size=HASH_BYTES, person=b"dualpath-kv1")
    h.update(bytes.fromhex(parent_hash) if parent_hash is not None else b"\0" * HASH_BYTES)
    h.update(np.asarray(token_ids, dtype="<i8").tobytes())
    return h.hexdigest()


def loadable_hit_blocks(prompt_len: int, block_size: int) -> int:
    """Whole cached blocks a prompt may load: the last prompt token is always computed (its
    logits give the first generated token), so a fully cached prompt loads one block less."""
    return (prompt_len - 1) // block_size


def chain_hashes(
    token_ids: Sequence[int] | np.ndarray, block_size: int, parent_hash: str | None = None
) -> list[str]:
    """Hashes of every whole block of ``token_ids`` (a trailing partial block is ignored)."""
    ids = np.asarray(token_ids, dtype="<i8")
    out: list[str] = []
    parent = parent_hash
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = block_hash(parent, ids[start : start + block_size])
        out.append(parent)
    return out
