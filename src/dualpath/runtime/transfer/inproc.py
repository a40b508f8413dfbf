"""In-process transport: endpoints of one process share an ``InProcFabric``.

Delivery calls the destination sink directly, so the cost of a hand-off is a Python call plus the
sink's copy. ``asynchronous=False`` (default) delivers inside ``submit`` and returns a completed
handle; ``asynchronous=True`` queues the batch to one progress thread per transport (FIFO, so items
to one destination arrive in submit order) and the handle completes when the thread has delivered it.
``notify`` hands control messages to the sink's ``control`` the same way, in the same FIFO.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dualpath.runtime.transfer.base import (
    KVSink,
    TransferError,
    TransferHandle,
    TransferItem,
    Transport,
)
from dualpath.runtime.transfer.control import Control


class InProcFabric:
    """Name -> sink table shared by the in-process transports of one process. Thread-safe."""

    def __init__(self) -> None:
        self._sinks: dict[str, KVSink] = {}
        self._lock = threading.Lock()

    def bind(self, endpoint: str, sink: KVSink) -> None:
        with self._lock:
            if endpoint in self._sinks:
                raise TransferError(f"endpoint {endpoint!r} is already bound")
            self._sinks[endpoint] = sink

    def sink(self, endpoint: str) -> KVSink:
        try:
            return self._sinks[endpoint]
        except KeyError:
            known = ", ".join(sorted(self._sinks)) or "none"
            raise TransferError(f"unknown endpoint {endpoint!r}; bound: {known}") from None

    def transport(self, *, asynchronous: bool = False) -> InProcTransport:
        return InProcTransport(self, asynchronous=asynchronous)


_Job = tuple[str, str, Sequence[TransferItem] | Sequence[Control], TransferHandle, bool]


class InProcTransport(Transport):
    """A Transport over an InProcFabric (see module docstring)."""

    def __init__(self, fabric: InProcFabric, *, asynchronous: bool = False) -> None:
        self._fabric = fabric
        self._closed = False
        self._completed = 0  # since the last poll; the progress thread adds, poll takes
        self._count_lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Job | None] | None = None
        self._thread: threading.Thread | None = None
        if asynchronous:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._progress, name="inproc-transfer", daemon=True)
            self._thread.start()

    def bind(self, endpoint: str, sink: KVSink) -> None:
        self._fabric.bind(endpoint, sink)

    def submit(
        self,
        dest: str,
        items: Sequence[TransferItem],
        *,
        source: str = "",
        callback: Callable[[TransferHandle], None] | None = None,
    ) -> TransferHandle:
        return self._send(
            dest, source, items, TransferHandle(len(items), sum(i.nbytes for i in items), callback), False
        )

    def notify(
        self,
        dest: str,
        msgs: Sequence[Control],
        *,
        source: str = "",
        callback: Callable[[TransferHandle], None] | None = None,
    ) -> TransferHandle:
        return self._send(dest, source, list(msgs), TransferHandle(len(msgs), 0, callback), True)

    def _send(
        self, dest: str, source: str, what: Sequence[Any], handle: TransferHandle, control: bool
    ) -> TransferHandle:
        if self._closed:
            raise TransferError("transport is closed")
        if self._queue is not None:
            self._queue.put((dest, source, what, handle, control))
        else:
            self._deliver(dest, source, what, handle, control)
        return handle

    def _deliver(
        self, dest: str, source: str, what: Sequence[Any], handle: TransferHandle, control: bool
    ) -> None:
        try:
            sink: Any = self._fabric.sink(dest)
            if not control:
                sink.deliver(source, what)
            elif hasattr(sink, "control"):
                sink.control(source, what)
            else:
                raise TransferError(f"endpoint {dest!r} takes no control messages")
        except Exception as exc:  # a failed delivery fails the handle, never the sender's thread
            handle.complete(exc)
        else:
            handle.complete()
        with self._count_lock:
            self._completed += 1

    def _progress(self) -> None:
        assert self._queue is not None
        while (job := self._queue.get()) is not None:
            self._deliver(*job)

    def poll(self) -> int:
        with self._count_lock:
            done, self._completed = self._completed, 0
        return done

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join()
