"""On-disk format of one Full Block file.

``[header (padded to a 4 KiB multiple)] [layer 0 bytes] [layer 1 bytes] ... [layer L-1 bytes]``

The header holds magic, version, the layout, this block's hash and its parent's, the token ids, one
crc32 per Layer Block (so a Layer Block read verifies alone) and a crc32 of the header itself. The data
starts page-aligned so the file can be read with O_DIRECT and Layer Blocks are whole byte ranges.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from dualpath.core.errors import DualpathError
from dualpath.runtime.kvstore.layout import HASH_BYTES, BlockLayout

try:  # ISA-L's crc32 gives zlib's values about 4x faster; optional (pip install isal)
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - depends on the environment
    from zlib import crc32 as _crc32

MAGIC = b"DPKVBLK\0"
VERSION = 1
PAGE_BYTES = 4096
SUFFIX = ".kvb"
_FIXED = struct.Struct(f"<8sIIIIIII{HASH_BYTES}s{HASH_BYTES}s")


class CorruptBlockError(DualpathError):
    """A block file has a bad header, wrong size or a failed checksum. Never use its data."""

    def __init__(self, block_hash: str, reason: str) -> None:
        self.block_hash = block_hash
        self.reason = reason
        super().__init__(f"corrupt KV block {block_hash}: {reason}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockHeader:
    """Decoded header of a block file. ``parent_hash`` None means a root block."""

    block_hash: str
    parent_hash: str | None
    token_bytes: bytes  # the block's token ids as little-endian int64
    layer_crcs: tuple[int, ...]
    header_bytes: int

    @property
    def token_ids(self) -> np.ndarray:
        return np.frombuffer(self.token_bytes, dtype="<i8")


def header_bytes_for(layout: BlockLayout) -> int:
    """Size of the padded header (= offset of layer 0's data) for ``layout``."""
    raw = _FIXED.size + 8 * layout.block_size + 4 * layout.num_layers + 4
    return -(-raw // PAGE_BYTES) * PAGE_BYTES


def file_bytes_for(layout: BlockLayout) -> int:
    """Exact size of a complete block file."""
    return header_bytes_for(layout) + layout.full_block_bytes


def crc_layers(data: memoryview, layout: BlockLayout) -> tuple[int, ...]:
    """crc32 of each Layer Block of a Full Block's bytes."""
    step = layout.layer_block_bytes
    return tuple(_crc32(data[i * step : (i + 1) * step]) for i in range(layout.num_layers))


def encode_header(
    layout: BlockLayout,
    block_hash: str,
    parent_hash: str | None,
    token_ids: np.ndarray,
    layer_crcs: tuple[int, ...],
) -> bytes:
    """Padded header bytes for a block (see module docstring)."""
    size = header_bytes_for(layout)
    parent = bytes.fromhex(parent_hash) if parent_hash is not None else b"\0" * HASH_BYTES
    fixed = _FIXED.pack(
        MAGIC, VERSION, size, layout.num_layers, layout.block_size,
        layout.kv_bytes_per_token_layer, len(token_ids), int(parent_hash is not None),
        bytes.fromhex(block_hash), parent,
    )  # fmt: skip
    body = fixed + np.asarray(token_ids, dtype="<i8").tobytes()
    body += np.asarray(layer_crcs, dtype="<u4").tobytes()
    body += struct.pack("<I", zlib.crc32(body))
    return body + b"\0" * (size - len(body))


def decode_header(buf: bytes | memoryview, layout: BlockLayout, expected_hash: str) -> BlockHeader:
    """Parse and verify a header; raise CorruptBlockError on any mismatch with ``layout``/hash."""
    size = header_bytes_for(layout)
    if len(buf) < size:
        raise CorruptBlockError(expected_hash, f"header truncated ({len(buf)} < {size} bytes)")
    fields = _FIXED.unpack_from(buf, 0)
    magic, version, hdr_bytes, layers, bsize, kvb, ntok, has_parent, own, parent = fields
    if magic != MAGIC or version != VERSION:
        raise CorruptBlockError(expected_hash, f"bad magic/version {magic!r}/{version}")
    if (hdr_bytes, layers, bsize, kvb) != (
        size, layout.num_layers, layout.block_size, layout.kv_bytes_per_token_layer,
    ):  # fmt: skip
        raise CorruptBlockError(expected_hash, f"layout mismatch {(layers, bsize, kvb)}")
    if ntok != layout.block_size:
        raise CorruptBlockError(expected_hash, f"token count {ntok} != block_size")
    tok_end = _FIXED.size + 8 * ntok
    crc_end = tok_end + 4 * layers
    (stored,) = struct.unpack_from("<I", buf, crc_end)
    if zlib.crc32(buf[:crc_end]) != stored:
        raise CorruptBlockError(expected_hash, "header checksum mismatch")
    if own.hex() != expected_hash:
        raise CorruptBlockError(expected_hash, f"file holds block {own.hex()}")
    return BlockHeader(
        block_hash=own.hex(),
        parent_hash=parent.hex() if has_parent else None,
        token_bytes=bytes(buf[_FIXED.size : tok_end]),
        layer_crcs=struct.unpack_from(f"<{layers}I", buf, tok_end),
        header_bytes=size,
    )


def verify_layers(header: BlockHeader, data: memoryview, layout: BlockLayout, first_layer: int = 0) -> None:
    """Check crc32 of consecutive Layer Blocks in ``data`` starting at ``first_layer``."""
    step = layout.layer_block_bytes
    crcs = header.layer_crcs
    for k in range(len(data) // step):
        if _crc32(data[k * step : (k + 1) * step]) != crcs[first_layer + k]:
            raise CorruptBlockError(header.block_hash, f"layer {first_layer + k} checksum mismatch")
