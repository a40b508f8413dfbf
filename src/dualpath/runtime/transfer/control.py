"""Typed control messages between engines, sent on the transport next to the KV they steer.

KV moves as ``TransferItem`` s (Layer Blocks, Full Blocks); what a PE and a DE tell each other about
one request's KV travels as one of the tagged frozen Structs below, through ``Transport.notify``,
in the same FIFO as the destination's KV (so a ``PrefillDone`` sent after a request's last Layer
Block arrives after it). Cross-process transports send them msgpack-encoded in the message header,
and the receiver decodes and validates them field by field (ids and counts >= 0, layers in range,
``start <= stop``); a message that fails is dropped and counted in the transport's ``drops``
(``runtime/transfer/drops.py``). What needs the receiver's state (is the request here, are the
tokens inside its hits) is checked by the receiving sink.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Protocol, Union

import msgspec
from msgspec import Meta

_Key = Annotated[str, Meta(min_length=1, max_length=256)]
_Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]
_Layer = Annotated[int, Meta(ge=0, le=2**16)]


class _Ctl(msgspec.Struct, frozen=True, kw_only=True, tag_field="t", tag=True):
    key: _Key  # the request


class PullLayer(_Ctl, frozen=True):
    """PE -> DE (DE read path): send tokens ``[start, stop)`` of ``layer`` from the DE buffer."""

    layer: _Layer
    start: _Count
    stop: _Count

    def __post_init__(self) -> None:
        if self.start > self.stop:
            raise ValueError(f"start {self.start} > stop {self.stop}")


class HitsLoaded(_Ctl, frozen=True):
    """DE -> PE: the DE's share of the request's hits is in the DE buffer, up to token
    ``end_tokens`` (fewer than planned when a block was missing or corrupt: the PE recomputes
    from there). DE read path: the PE may start; split: the DE share is cut at ``end_tokens``."""

    end_tokens: _Count


class PrefillDone(_Ctl, frozen=True):
    """PE -> DE: all of the prompt's KV is in the DE buffer; decoding starts from ``first_token``."""

    first_token: _Count


Control = Union[PullLayer, HitsLoaded, PrefillDone]  # noqa: UP007 (msgspec tagged union)
MAX_CONTROLS = 1 << 12  # control messages per transport message


class ControlSink(Protocol):
    """An endpoint (a ``KVSink``) that also takes control messages; ``control`` must not block."""

    def control(self, source: str, msgs: Sequence[Control]) -> None: ...
