"""A prefill engine's waiting list, as the policy's BatchView sees it (FIFO, chunk progress)."""

from __future__ import annotations

from dualpath.policy import views as pv


class PrefillQueue:
    """Requests on one PE with tokens left to compute, in assignment order."""

    def __init__(self, engine_id: int) -> None:
        self.engine_id = engine_id
        self._items: dict[str, list[int]] = {}  # rid -> [cached_len, new_len]

    def add(self, rid: str, cached_len: int, new_len: int) -> None:
        self._items[rid] = [cached_len, new_len]

    def remove(self, rid: str) -> None:
        self._items.pop(rid, None)

    def __len__(self) -> int:
        return len(self._items)

    def view(self, now_s: float, ready: set[str] | None = None) -> pv.BatchView:
        """The BatchView of requests in ``ready`` (all when None), FIFO."""
        return pv.BatchView(
            now_s=now_s,
            engine_id=self.engine_id,
            waiting=tuple(
                pv.BatchItem(request_id=r, cached_len=c, new_len=n)
                for r, (c, n) in self._items.items()
                if ready is None or r in ready
            ),
        )

    def advance(self, rid: str, chunk_len: int) -> bool:
        """Record ``chunk_len`` computed tokens; True when the request has no tokens left."""
        item = self._items[rid]
        item[0] += chunk_len
        item[1] -= chunk_len
        if item[1] <= 0:
            del self._items[rid]
            return True
        return False
