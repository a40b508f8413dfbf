"""The transfer interface for Layer Blocks and Full Blocks between engines.

Model: every engine owns one ``Transport`` and binds named endpoints on it (e.g. ``"pe0"``,
``"de1"``), each with a ``KVSink`` that receives what arrives there. A sender calls
``submit(dest, items)`` with one or more ``TransferItem``s (several Layer Blocks per submit is the
batching that amortises per-transfer cost, as doorbell batching does for RDMA); it gets back a
``TransferHandle`` that completes once every item has been delivered into the destination sink (the
sink has copied or consumed the payload, so the sender may reuse its buffer). Completion is observed by
polling (``handle.done``, ``transport.poll()``), by blocking (``handle.wait(timeout_s)``) or by a
callback passed to ``submit`` (run on the transport's progress thread or inside ``poll``; keep it short).

Implementations: ``InProcTransport`` (transfer/inproc.py, one process); ZeroMQ/TCP and shared memory
transports live in other modules of this package and follow the same contract. Errors during delivery
complete the handle with ``error`` set; ``wait`` then raises ``TransferError``.

Control signals about a request's KV (a layer to pull, hits loaded, prefill done) are typed messages
(``transfer/control.py``) sent with ``notify``, never KV items with special layer numbers.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Union

import torch

from dualpath.core.errors import DualpathError

if TYPE_CHECKING:
    from dualpath.runtime.transfer.control import Control

Payload = Union[torch.Tensor, bytes, bytearray, memoryview]  # noqa: UP007
FULL_BLOCK = -1  # ``TransferItem.layer`` of a Full Block (all layers)


class TransferError(DualpathError):
    """A transfer failed (unknown destination, sink error, closed transport, timeout)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferItem:
    """One Layer Block (``layer >= 0``) or Full Block (``layer == FULL_BLOCK``) on the wire.

    ``key`` names the owner (a request id); ``block_index`` is the block's position in that request's
    token sequence; ``token_offset`` the first valid slot (a chunk may start mid-block); ``num_tokens``
    how many tokens the payload holds. A Layer Block item normally stays inside its block, but a
    *span* item may run on into the following blocks of the same request: it carries the request's
    tokens ``[block_index * block_size + token_offset, ... + num_tokens)`` of one layer, contiguous
    (e.g. a chunk's new KV, straight from the device). Sinks accept both.
    ``payload`` is the block's bytes, or a tensor (any dtype; a transport that crosses processes
    sends its raw bytes and the sink reinterprets them with the layout it knows).
    """

    key: str
    block_index: int
    layer: int
    num_tokens: int
    payload: Payload
    token_offset: int = 0

    @property
    def nbytes(self) -> int:
        p = self.payload
        if isinstance(p, torch.Tensor):
            return p.nbytes
        return memoryview(p).nbytes


class KVSink(Protocol):
    """Receiving side of an endpoint. ``deliver`` must copy or consume the payload before returning."""

    def deliver(self, source: str, items: Sequence[TransferItem]) -> None: ...


class TransferHandle:
    """Completion of one ``submit``. Thread-safe; completes exactly once."""

    __slots__ = ("_event", "_callback", "error", "nbytes", "num_items")

    def __init__(
        self, num_items: int, nbytes: int, callback: Callable[[TransferHandle], None] | None = None
    ) -> None:
        self._event = threading.Event()
        self._callback = callback
        self.error: BaseException | None = None
        self.nbytes = nbytes
        self.num_items = num_items

    @property
    def done(self) -> bool:
        """True once delivered (or failed: check ``error``)."""
        return self._event.is_set()

    def complete(self, error: BaseException | None = None) -> None:
        """Mark finished (called by the transport); runs the callback once."""
        if self._event.is_set():
            return
        self.error = error
        self._event.set()
        if self._callback is not None:
            self._callback(self)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until complete; raise TransferError on failure or timeout."""
        if not self._event.wait(timeout_s):
            raise TransferError(f"transfer of {self.num_items} items timed out after {timeout_s} s")
        if self.error is not None:
            raise TransferError(f"transfer failed: {self.error}") from self.error


class Transport(ABC):
    """Moves TransferItems from this engine to named endpoints (see module docstring)."""

    @abstractmethod
    def bind(self, endpoint: str, sink: KVSink) -> None:
        """Receive items addressed to ``endpoint`` into ``sink``. One sink per endpoint name."""

    @abstractmethod
    def submit(
        self,
        dest: str,
        items: Sequence[TransferItem],
        *,
        source: str = "",
        callback: Callable[[TransferHandle], None] | None = None,
    ) -> TransferHandle:
        """Send ``items`` to endpoint ``dest`` as one batch; returns at once or after a local copy.

        The caller must not modify the payloads until the handle is done.
        """

    @abstractmethod
    def notify(
        self,
        dest: str,
        msgs: Sequence[Control],
        *,
        source: str = "",
        callback: Callable[[TransferHandle], None] | None = None,
    ) -> TransferHandle:
        """Send typed control messages (``transfer/control.py``) to endpoint ``dest``, whose sink
        must be a ``ControlSink``. Same FIFO as ``submit``: they arrive after the items submitted
        to ``dest`` before them. The handle completes once the sink's ``control`` returned."""

    def submit_one(
        self, dest: str, key: str, block_index: int, layer: int, payload: Payload, num_tokens: int
    ) -> TransferHandle:
        """Convenience: submit a single block."""
        item = TransferItem(key=key, block_index=block_index, layer=layer,
                            num_tokens=num_tokens, payload=payload)  # fmt: skip
        return self.submit(dest, [item])

    def register(self, buf: object) -> int:
        """Register ``buf`` (an engine's KV buffer: a contiguous CPU tensor or buffer) once, so that
        payloads lying inside it are sent from where they are; the bytes newly registered. The
        one-sided engines (``onesided.py``: mooncake, nixl) read such payloads in place instead of
        copying them into their send ring; the others have no registered memory (zmq sends the
        payload's own bytes as frames, shm copies into its ring) and return 0."""
        return 0

    def poll(self) -> int:
        """Make progress on outstanding transfers; returns how many completed during this call."""
        return 0

    def close(self) -> None:  # noqa: B027 (optional hook: transports without resources keep it)
        """Release resources; later submits raise TransferError."""
