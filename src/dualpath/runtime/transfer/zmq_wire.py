"""The ZeroMQ transport's wire format: the msgspec headers of a data submit (``DataMsg`` naming
its ``ItemMeta`` items, one payload frame each), of control messages (``CtlMsg``) and of acks
(``AckMsg``), every field bounded so that a forged header fails validation, and ``payload_view``,
the raw bytes a payload is sent as. ``zmq_transport.py``, ``shm_transport.py`` and ``onesided.py`` speak it.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import torch

from dualpath.runtime.transfer.control import MAX_CONTROLS, Control

_Meta = msgspec.Meta
_Count = Annotated[int, _Meta(ge=0, le=2**63 - 1)]
_Name = Annotated[str, _Meta(max_length=256)]
_ReplyTo = Annotated[str, _Meta(pattern=r"^(tcp://[^\s/]+:[0-9]{1,5}|ipc:///[^\s]+)$", max_length=512)]


class ItemMeta(msgspec.Struct, array_like=True, frozen=True):
    key: Annotated[str, _Meta(min_length=1, max_length=256)]
    block_index: Annotated[int, _Meta(ge=-1, le=2**31)]
    layer: Annotated[int, _Meta(ge=-1, le=2**16)]  # -1: FULL_BLOCK
    num_tokens: _Count
    token_offset: _Count
    nbytes: _Count
    slot: Annotated[int, _Meta(ge=-1, le=2**63 - 1)] = -1  # shm offset (shm transport); -1 = frame


class DataMsg(msgspec.Struct, array_like=True, frozen=True, tag="d"):
    seq: _Count
    reply_to: _ReplyTo
    dest: _Name
    source: _Name
    items: Annotated[list[ItemMeta], _Meta(max_length=1 << 16)]
    segment: Annotated[str, _Meta(max_length=1024)] = ""  # where the slots are (shm file, engine peer)
    peer: Annotated[bytes, _Meta(max_length=1 << 16)] = b""  # what reaching ``segment`` needs (NIXL)


class CtlMsg(msgspec.Struct, array_like=True, frozen=True, tag="c"):
    """Typed control messages for endpoint ``dest`` (no payload frames)."""

    seq: _Count
    reply_to: _ReplyTo
    dest: _Name
    source: _Name
    msgs: Annotated[list[Control], _Meta(max_length=MAX_CONTROLS)]


class AckMsg(msgspec.Struct, array_like=True, frozen=True, tag="a"):
    seq: _Count
    error: Annotated[str, _Meta(max_length=4096)] | None = None


DECODER = msgspec.msgpack.Decoder(DataMsg | AckMsg | CtlMsg)
ENCODER = msgspec.msgpack.Encoder()


def payload_view(payload: Any) -> memoryview:
    """Raw bytes of a payload (a tensor of any dtype is sent as its contiguous bytes)."""
    if isinstance(payload, torch.Tensor):
        t = payload.detach().contiguous()
        if t.device.type != "cpu":
            t = t.cpu()
        return memoryview(t.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]
    return memoryview(payload).cast("B")
