"""The planner's two interconnects: D2D inside a domain, N2N across pool boundaries.

- **D2D** (NVSwitch class, ``D2D_GBS`` per device and direction, one domain of ``D2D_DOMAIN``
  devices) carries the TP all-reduces, the EP all-to-alls and the PP hand-offs. These are closed
  forms inside a stage's step time (no events): the planner schedules no per-layer events.
- **N2N** (InfiniBand class, ``N2N_GBS`` per device and direction) carries everything that crosses
  a pool boundary: the KV hand-off PA -> DA (P -> D) and the activation round trips of an A/F split.
  A transfer between replicas of ``a`` and ``b`` devices runs at ``min(a, b) x N2N_GBS``; each
  boundary is a FIFO :class:`dualpath.sim.links.Link` (the simulator's own link server), so the
  bytes it moved are counted where they were reserved and the run can check them.

Transfer time is bytes / bandwidth; ``latency_s`` (default 0, ``--link-latency-us``) is added once
per transfer.
"""

from __future__ import annotations

from typing import Final

from dualpath.core.errors import require
from dualpath.sim.links import Link, transfer

D2D_GBS: Final = 3600.0  # NVLink-4/NVSwitch class, per device and direction (paper: 3,600 GB/s)
D2D_DOMAIN: Final = 8  # devices per D2D domain (one NVSwitch node); TP stays inside it
N2N_GBS: Final = 50.0  # 400 Gb/s InfiniBand class, per device and direction (paper: 50 GB/s)
N2N_CLASS: Final = "n2n"  # accounting class of every planner link


def allreduce_bytes(message_bytes: float, tp: int) -> float:
    """Bytes each device sends in a ring all-reduce of ``message_bytes`` over ``tp`` devices:
    ``2 (t-1)/t x message`` (reduce-scatter then all-gather); 0 at t = 1."""
    require(tp >= 1, "tp", tp, "must be >= 1")
    return 2.0 * (tp - 1) / tp * message_bytes


def ep_fraction(ep: int) -> float:
    """Share of the dispatch + combine bytes that leaves a device under EP ``e``: ``(e-1)/e``
    (uniform routing: a token's expert is local with probability 1/e). 0 at e = 1, -> 1."""
    require(ep >= 1, "ep", ep, "must be >= 1")
    return (ep - 1) / ep


def ep_bytes(dispatch_combine_bytes: float, ep: int) -> float:
    """Bytes of an EP all-to-all that cross D2D."""
    return ep_fraction(ep) * dispatch_combine_bytes


def d2d_time_s(nbytes: float, senders: int = 1, d2d_gbs: float = D2D_GBS) -> float:
    """Time to move ``nbytes`` over D2D when ``senders`` devices send their shares in parallel."""
    require(senders >= 1, "senders", senders, "must be >= 1")
    return nbytes / (senders * d2d_gbs * 1e9) if nbytes > 0 else 0.0


def collective_s(kind: str, message_bytes: float, n: int, d2d_gbs: float = D2D_GBS) -> float:
    """D2D time of one collective over ``n`` devices, ``message_bytes`` per device: a ring
    ``allreduce`` sends ``2 (n-1)/n x message`` per device, an ``alltoall`` ``(n-1)/n x message``;
    every device sends at once at ``d2d_gbs`` (the model the run's step times use)."""
    require(kind in ("allreduce", "alltoall"), "kind", kind, "choices: allreduce, alltoall")
    sent = allreduce_bytes(message_bytes, n) if kind == "allreduce" else ep_bytes(message_bytes, n)
    return d2d_time_s(sent, 1, d2d_gbs)


def n2n_bytes_per_s(a_devices: int, b_devices: int, n2n_gbs: float = N2N_GBS) -> float:
    """Bandwidth of a transfer between replicas of ``a`` and ``b`` devices: ``min(a, b) x N2N``."""
    require(a_devices >= 1 and b_devices >= 1, "devices", (a_devices, b_devices), "must be >= 1")
    return min(a_devices, b_devices) * n2n_gbs * 1e9


def n2n_link(name: str, a_devices: int, b_devices: int, n2n_gbs: float = N2N_GBS) -> Link:
    """One direction of a pool boundary between replicas of ``a`` and ``b`` devices (FIFO)."""
    return Link(name, N2N_CLASS, n2n_bytes_per_s(a_devices, b_devices, n2n_gbs))


def n2n_transfer(link: Link, nbytes: float, ready_s: float, latency_s: float = 0.0) -> float:
    """Reserve ``nbytes`` on ``link`` FIFO from ``ready_s``; return when they have arrived."""
    if nbytes <= 0:
        return ready_s
    return transfer((link,), nbytes, ready_s) + latency_s


def link_bytes(links: list[Link]) -> float:
    """Bytes moved over ``links`` (the N2N total a run reports and checks)."""
    return sum(link.bytes_moved for link in links)
