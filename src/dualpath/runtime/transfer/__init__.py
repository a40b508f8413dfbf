"""Transfers of Layer Blocks and Full Blocks between engines, and the typed control messages that
steer them: one interface, several transports.

The names below load on first use (PEP 562): ``transfer.auth`` (CURVE keys, which an engine's
heartbeat thread needs from its first moment) imports without torch, which ``base`` needs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_WHERE = {
    **dict.fromkeys(
        ("FULL_BLOCK", "KVSink", "Payload", "TransferError", "TransferHandle", "TransferItem", "Transport"),
        "base",
    ),
    **dict.fromkeys(("Control", "ControlSink", "HitsLoaded", "PrefillDone", "PullLayer"), "control"),
    **dict.fromkeys(("InProcFabric", "InProcTransport"), "inproc"),
}

__all__ = [
    "FULL_BLOCK", "Control", "ControlSink", "HitsLoaded", "InProcFabric", "InProcTransport", "KVSink",
    "Payload", "PrefillDone", "PullLayer", "TransferError", "TransferHandle", "TransferItem", "Transport",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
