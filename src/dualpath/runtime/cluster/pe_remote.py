"""What a prefill worker's engine sees of the store and of the DEs across processes: ``PeIO`` (its
``IOEngine``: hit blocks through this node's SNIC), ``RemoteDE`` (its ``RemoteKV`` of one DE:
``PullLayer`` / ``HitsLoaded`` control messages, pulled layers awaited as ``Pull`` s, a split share
counted as ``Split``). They share the worker's ``_lock`` / ``_cond`` and its request tables."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from dualpath.runtime.kvstore import ReadResult
from dualpath.runtime.transfer.base import TransferError
from dualpath.runtime.transfer.control import PullLayer

if TYPE_CHECKING:
    from dualpath.runtime.cluster.prefill_worker import PrefillWorker


class Split:
    """The DE share of a split request: block futures resolved when all its layers arrived."""

    __slots__ = ("futures", "hashes", "left", "first_block", "block_tokens")

    def __init__(
        self, hashes: Sequence[str], futures: list[Future[ReadResult]], first_block: int, block_tokens: int
    ) -> None:
        self.hashes, self.futures, self.left = list(hashes), futures, len(hashes) * block_tokens
        self.first_block, self.block_tokens = first_block, block_tokens

    def cut(self, end_block: int) -> None:
        """The DE read its share only up to block ``end_block`` (a miss ended it): the blocks
        after fail (the engine recomputes from there), the rest resolve when they arrived."""
        keep = max(0, min(end_block - self.first_block, len(self.futures)))
        for h, f in zip(self.hashes[keep:], self.futures[keep:], strict=True):
            if not f.done():
                f.set_result(ReadResult(block_hash=h, layer=None, ok=False, data=None))
                self.left -= self.block_tokens
        if self.left <= 0:
            self.resolve(ok=True)

    def arrived(self, num_tokens: int) -> None:
        self.left -= num_tokens
        if self.left <= 0:
            self.resolve(ok=True)

    def resolve(self, *, ok: bool) -> None:
        for h, f in zip(self.hashes, self.futures, strict=True):
            if not f.done():
                f.set_result(ReadResult(block_hash=h, layer=None, ok=ok, data=None))


class PeIO:
    """The engine's ``IOEngine`` on a PE: hit blocks read through this node's SNIC (``pe-read``)."""

    def __init__(self, worker: PrefillWorker) -> None:
        self.w = worker

    def submit_blocks(self, hashes: list[str], outs: list[np.ndarray]) -> list[Future[ReadResult]]:
        futures: list[Future[ReadResult]] = [Future() for _ in hashes]

        def done(num_read: int, err: BaseException | None) -> None:
            ok_upto = num_read if err is None else 0  # a miss ends the loaded prefix
            for i, (h, out, f) in enumerate(zip(hashes, outs, futures, strict=False)):
                f.set_result(ReadResult(block_hash=h, layer=None, ok=i < ok_upto, data=out))

        self.w.io.read_into(hashes, outs[: len(hashes)], "pe-read", done)
        return futures


class RemoteDE:
    """``RemoteKV`` of one DE across processes: hits announced by its ``HitsLoaded``; a layer is
    pulled with a ``PullLayer`` and arrives as Layer Blocks in the staging slot (``deliver``); a
    split share is pushed by the DE into the PE buffer (``deliver``, counted by ``Split``)."""

    def __init__(self, worker: PrefillWorker, de_id: int) -> None:
        self.w, self.de_id = worker, de_id

    def loaded_hit_tokens(self, request_id: str) -> int | None:
        with self.w._lock:
            return self.w._hits.get(request_id)

    def request_layer(self, request_id: str, layer: int, start: int, stop: int, dest: str) -> Pull:
        with self.w._lock:
            self.w._arrived[(request_id, layer)] = 0
        ask = PullLayer(key=request_id, layer=layer, start=start, stop=stop)
        self.w.transport.notify(f"e{self.de_id}", [ask], source=f"e{self.w.engine_id}")
        return Pull(self.w, request_id, layer, stop - start, self.de_id)

    def pushed_share(
        self, request_id: str, first_block: int, hashes: Sequence[str], dest: str
    ) -> list[Future[ReadResult]]:
        """The DE reads and pushes this share on its own (its ``DecodeTask`` says "split"); the
        futures resolve as its layers arrive (``deliver``) or its ``HitsLoaded`` cuts it."""
        geo = self.w.geo
        futures: list[Future[ReadResult]] = [Future() for _ in hashes]
        sp = Split(hashes, futures, first_block, geo.block_size * geo.num_layers)
        with self.w._lock:
            self.w._split[request_id] = sp
            end = self.w._hits.pop(request_id, None)  # the DE's cut came first
            if end is not None:
                sp.cut(end // geo.block_size)
        return futures


class Pull:
    """Handle of one pulled layer: done when ``num_tokens`` tokens of it are in the staging slot."""

    def __init__(self, w: PrefillWorker, rid: str, layer: int, num_tokens: int, de_id: int) -> None:
        self.w, self.key, self.num_tokens, self.de_id = w, (rid, layer), num_tokens, de_id

    def wait(self, timeout_s: float | None = None) -> None:
        end = time.monotonic() + (timeout_s if timeout_s is not None else 1e9)
        with self.w._cond:
            while self.w._arrived.get(self.key, 0) < self.num_tokens:
                left = end - time.monotonic()
                if left <= 0 or not self.w._cond.wait(left):
                    if self.w._arrived.get(self.key, 0) < self.num_tokens:
                        raise TransferError(f"layer {self.key[1]} of {self.key[0]} from decode "
                                            f"engine {self.de_id} did not arrive")  # fmt: skip
            self.w._arrived.pop(self.key, None)


def when_all(futures: Sequence[Future[ReadResult]], fn: Callable[[], None]) -> None:
    """Call ``fn`` once every future is done (on the thread finishing the last one)."""
    left, lock = [len(futures)], threading.Lock()
    if not futures:
        fn()

    def one(_: Future[ReadResult]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            fn()

    for f in futures:
        f.add_done_callback(one)
