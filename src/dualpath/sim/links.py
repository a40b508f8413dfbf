"""Links as FIFO queue servers, one per link and direction: the project's one link model
(:mod:`dualpath.core.links`, shared with the runtime's emulated NICs), written out inline here
because these are the simulator's hottest lines; ``tests/core/test_links.py`` holds every booking
equal to :func:`dualpath.core.links.book`.

A :class:`Link` serves byte transfers in submission order at its bandwidth: a transfer that becomes
ready at ``t`` starts at ``max(t, free_at_s)``. A transfer across several links (a path step of spec
section 4, e.g. PE DRAM -> CNIC loopback -> PE HBM) is pipelined: each link serves it from its own
free time for ``bytes / its bandwidth``; it ends when the last link is done.
This is exact for one flow per link and a good approximation of fair sharing when flows are
numerous and similar (the aggregate rate is the same; only the order within a link differs).

Model traffic (EP all-to-all) uses the high-priority lane of a CNIC: :meth:`Link.preempt` takes
its bytes first, pushing queued KV transfers later, so KV only gets the idle rest (spec section 7).
(``free_at_s`` is the model's ``free_s``; the model's ``ctl_free_s`` only times the model traffic
itself, which the simulator never waits on, so it is not kept.) A node's storage NIC is one link
for reads and persists, or one per direction (``SimConfig.snic_directions``).

Every link counts its bytes and busy seconds; ``busy_s <= elapsed`` is the "no link above 100%"
invariant, true by construction and re-checked at the end of a run.
"""

from __future__ import annotations

from collections.abc import Sequence

from dualpath.core.errors import require


class Link:
    """One link direction. ``cls`` is its accounting class (``snic``, ``cnic_tx``, ``cnic_rx``, ``dram``)."""

    __slots__ = (
        "name",
        "cls",
        "bytes_per_s",
        "free_at_s",
        "busy_s",
        "bytes_moved",
        "kv_bytes",
        "model_bytes",
    )

    def __init__(self, name: str, cls: str, bytes_per_s: float) -> None:
        require(bytes_per_s > 0, f"{name}.bytes_per_s", bytes_per_s, "must be > 0")
        self.name = name
        self.cls = cls
        self.bytes_per_s = bytes_per_s
        self.free_at_s = 0.0
        self.busy_s = 0.0
        self.bytes_moved = 0.0
        self.kv_bytes = 0.0
        self.model_bytes = 0.0

    def preempt(self, nbytes: float, now_s: float) -> None:
        """High-priority (model) traffic of ``nbytes`` starting at ``now_s``: delays queued KV."""
        if nbytes <= 0:
            return
        dur = nbytes / self.bytes_per_s
        start = self.free_at_s if self.free_at_s > now_s else now_s
        self.free_at_s = start + dur
        self.busy_s += dur
        self.bytes_moved += nbytes
        self.model_bytes += nbytes


def transfer(links: Sequence[Link], nbytes: float, ready_s: float) -> float:
    """Reserve ``nbytes`` on every link of a path; return when the last link is done.

    Each link serves the transfer FIFO from ``max(ready, its own free time)`` for ``bytes / its
    bandwidth``; the transfer ends when the slowest of them ends (pipelined cut-through). Links are
    not made to wait for each other: reserving a fast link at the start time of a congested slow one
    would leave idle gaps on the fast link that later transfers could never use. Zero bytes cost
    nothing and end at ``ready_s``."""
    if nbytes <= 0:
        return ready_s
    end = ready_s
    for link in links:
        done = _take(link, nbytes, ready_s)
        if done > end:
            end = done
    return end


def _take(link: Link, nbytes: float, ready_s: float) -> float:
    """One link's share of :func:`transfer`: reserve it FIFO, return when it is done."""
    free = link.free_at_s
    dur = nbytes / link.bytes_per_s
    done = (free if free > ready_s else ready_s) + dur
    link.free_at_s = done
    link.busy_s += dur
    link.bytes_moved += nbytes
    link.kv_bytes += nbytes
    return done


def transfer2(a: Link, b: Link, nbytes: float, ready_s: float) -> float:
    """:func:`transfer` over the path ``(a, b)`` without building a sequence (same arithmetic;
    each link's done time is at least ``ready_s``, so the path ends at the later of the two)."""
    if nbytes <= 0:
        return ready_s
    done_a = _take(a, nbytes, ready_s)
    done_b = _take(b, nbytes, ready_s)
    return done_b if done_b > done_a else done_a


def transfer3(a: Link, b: Link, c: Link, nbytes: float, ready_s: float) -> float:
    """:func:`transfer` over the path ``(a, b, c)`` without building a sequence (same arithmetic)."""
    if nbytes <= 0:
        return ready_s
    done_ab = transfer2(a, b, nbytes, ready_s)
    done_c = _take(c, nbytes, ready_s)
    return done_c if done_c > done_ab else done_ab


def check_utilisation(links: Sequence[Link], elapsed_s: float) -> float:
    """Return the highest utilisation; raise if any link was busier than the time that passed."""
    worst = 0.0
    for link in links:
        horizon = max(elapsed_s, link.free_at_s)
        if horizon <= 0:
            continue
        util = link.busy_s / horizon
        if util > 1.0 + 1e-6:
            raise AssertionError(f"link {link.name} above 100%: {util:.4f}")
        worst = max(worst, link.busy_s / elapsed_s if elapsed_s > 0 else 0.0)
    return worst
