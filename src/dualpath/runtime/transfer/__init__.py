"""Transfers of Layer Blocks and Full Blocks between engines, and the typed control messages that
steer them: one interface, several transports."""

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
from dualpath.runtime.transfer.control import Control, ControlSink, HitsLoaded, PrefillDone, PullLayer
from dualpath.runtime.transfer.inproc import InProcFabric, InProcTransport

__all__ = [
    "FULL_BLOCK", "Control", "ControlSink", "HitsLoaded", "InProcFabric", "InProcTransport", "KVSink",
    "Payload", "PrefillDone", "PullLayer", "TransferError", "TransferHandle", "TransferItem", "Transport",
]  # fmt: skip
