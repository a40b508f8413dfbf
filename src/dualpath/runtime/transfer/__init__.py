"""Transfers of Layer Blocks and Full Blocks between engines: one interface, several transports."""

from __future__ import annotations

from dualpath.runtime.transfer.base import (
    FULL_BLOCK,
    KVSink,
    Payload,
    TransferError,
    TransferHandle,
    TransferItem,
    Transport,
)
from dualpath.runtime.transfer.inproc import InProcFabric, InProcTransport

__all__ = [
    "FULL_BLOCK", "InProcFabric", "InProcTransport", "KVSink", "Payload", "TransferError",
    "TransferHandle", "TransferItem", "Transport",
]  # fmt: skip
