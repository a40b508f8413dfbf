"""What both engine workers share: the task table under one lock, the load the heartbeat reports,
``reset``, and transfer items (and control messages) that arrived before their task."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from dualpath.runtime.cluster.messages import Progress
from dualpath.runtime.transfer.base import TransferItem
from dualpath.runtime.transfer.control import Control

log = logging.getLogger(__name__)

ORPHAN_TTL_S = 60.0  # items of a request whose task never comes (cancelled meanwhile) are dropped
# Bytes of early KV an engine holds for tasks it has not seen. Legit early KV is what a PE sends
# before the DE's main loop took the DecodeTask (sent first) off its socket: at most a decode
# step's worth of layers (SmolLM2: 12.6 MB per layer of an 8k-token prompt). A peer that sends KV
# for tasks that never come cannot grow an engine past this.
ORPHAN_MAX_BYTES = 256 << 20


class Orphans:
    """Copies of transfer items (and the control messages) that beat their task here, per request
    key, in arrival order. Keys older than ORPHAN_TTL_S are purged whenever a new key arrives; the
    items' bytes are capped at ``max_bytes`` (the oldest keys' items go first; an item that still
    does not fit is dropped; each drop counted as ``data/orphan_cap`` on the owner's transport
    drop counter). Not locked: callers hold the worker lock."""

    def __init__(self, owner: object = None, max_bytes: int = ORPHAN_MAX_BYTES) -> None:
        self._items: dict[str, list[TransferItem | Control]] = {}
        self._first_s: dict[str, float] = {}  # first arrival of each key
        self._bytes: dict[str, int] = {}  # transfer-item bytes held per key
        self.total_bytes = 0
        self.max_bytes = max_bytes
        self._owner = owner

    def hold(self, it: TransferItem | Control) -> None:
        now = time.monotonic()
        if it.key not in self._items:
            for key in [k for k, t in self._first_s.items() if now - t > ORPHAN_TTL_S]:
                self.discard(key)
            self._first_s[it.key] = now
            self._items[it.key] = []
        if isinstance(it, TransferItem):
            nbytes = _nbytes(it)
            if not self._make_room(nbytes, it.key):
                self._dropped(f"{it.key}: {nbytes} bytes of early KV over the {self.max_bytes}-byte cap")
                return
            self._bytes[it.key] = self._bytes.get(it.key, 0) + nbytes
            self.total_bytes += nbytes
            it = _copy(it)
        self._items[it.key].append(it)

    def _make_room(self, nbytes: int, keep: str) -> bool:
        """Drop the oldest other keys' items until ``nbytes`` more fit; False if they cannot."""
        for key in list(self._first_s):
            if self.total_bytes + nbytes <= self.max_bytes:
                break
            if key != keep and self._bytes.get(key):
                self._dropped(f"{key}: its early KV ({self._bytes[key]} bytes) made room for newer")
                self.discard(key)
        return self.total_bytes + nbytes <= self.max_bytes

    def _dropped(self, detail: str) -> None:
        drops = getattr(getattr(self._owner, "transport", None), "drops", None)
        if drops is not None:
            drops.drop("data", "orphan_cap", detail)

    def take(self, key: str) -> list[TransferItem | Control]:
        """The items held for ``key`` (now its task is here), forgetting them."""
        self._first_s.pop(key, None)
        self.total_bytes -= self._bytes.pop(key, 0)
        return self._items.pop(key, [])

    def discard(self, key: str) -> None:
        self._first_s.pop(key, None)
        self.total_bytes -= self._bytes.pop(key, 0)
        self._items.pop(key, None)


def _nbytes(it: TransferItem) -> int:
    p = it.payload
    return int(p.numel() * p.element_size()) if isinstance(p, torch.Tensor) else memoryview(p).nbytes


def _copy(it: TransferItem) -> TransferItem:
    p = it.payload
    return TransferItem(
        key=it.key,
        block_index=it.block_index,
        layer=it.layer,
        num_tokens=it.num_tokens,
        token_offset=it.token_offset,
        payload=p.clone() if isinstance(p, torch.Tensor) else bytes(p),
    )


class WorkerBase:
    """``_tasks`` (request key -> task) under ``_lock`` and the FIFO of tasks waiting for admission;
    subclasses say how many tokens a task holds, how to admit one and how to cancel one.

    Per-request isolation: a task whose admission raises, or whose computation the subclass cannot
    finish, is failed alone (``fail_task``: its resources released, a "failed" Progress to the
    scheduler, which sends its client an error event and cancels it on the other engine); the
    engine goes on serving the others. Subclasses set ``engine_id`` and ``outbox``."""

    engine_id: int
    outbox: Any

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[str, Any] = {}
        self._waiting: list[str] = []  # tasks not yet admitted (waiting for buffer room), in order
        self._last_load = (0, 0)
        self._orphans = Orphans(self)
        self.num_failed_requests = 0  # requests this engine failed alone (isolation)

    def _task_tokens(self, task: Any) -> int:
        raise NotImplementedError

    def _admit_one(self, task: Any) -> bool:
        """Admit one waiting task (buffer room); False if it does not fit yet."""
        raise NotImplementedError

    def cancel(self, rid: str) -> None:
        raise NotImplementedError

    def _release_failed(self, rid: str) -> None:
        """Free engine resources of a failed request beyond what ``cancel`` frees (default none)."""

    def add(self, task: Any) -> None:
        with self._lock:
            self._tasks[task.request_id] = task
        self._waiting.append(task.request_id)
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        """Admit waiting tasks in order, stopping at the first that does not fit (cancelled ones
        are skipped; one whose admission raises is failed alone)."""
        while self._waiting:
            rid = self._waiting[0]
            task = self._tasks.get(rid)
            try:
                if task is not None and not self._admit_one(task):
                    return
            except Exception as exc:  # this request's data, not the engine: fail it only
                self._waiting.pop(0)
                self.fail_task(rid, "could not start the request (see the engine log)", exc)
                continue
            self._waiting.pop(0)

    def fail_task(self, rid: str, reason: str, exc: BaseException | None = None) -> None:
        """Fail one request on this engine: release what it holds (``cancel``) and report it."""
        if exc is not None:
            log.warning(
                "engine %s: request %s failed: %s",
                self.engine_id,
                rid,
                reason,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        self.num_failed_requests += 1
        try:
            self._release_failed(rid)
            self.cancel(rid)
        except Exception:  # releasing must not take the engine down either
            log.exception("engine %s: releasing failed request %s", self.engine_id, rid)
        self.outbox.put(
            Progress(
                request_id=rid,
                engine_id=self.engine_id,
                event="failed",
                error=f"engine {self.engine_id}: {reason}"[:1000],
            )
        )

    def load(self) -> tuple[int, int]:
        """(sequences, tokens) held; the last value if the lock is busy (heartbeats never wait)."""
        if not self._lock.acquire(timeout=0.05):
            return self._last_load
        try:
            self._last_load = len(self._tasks), sum(map(self._task_tokens, self._tasks.values()))
        finally:
            self._lock.release()
        return self._last_load

    def reset(self) -> None:
        """Drop every task (the scheduler re-dispatched them after declaring this engine dead)."""
        with self._lock:
            rids = list(self._tasks)
        for rid in rids:
            self.cancel(rid)
