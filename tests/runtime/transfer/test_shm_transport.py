"""The shared-memory transport's own parts; its contract is test_contract.py's."""

from __future__ import annotations

from dualpath.runtime.transfer.shm_transport import _Ring


def test_ring_reuses_space_in_fifo_order() -> None:
    ring = _Ring(100)
    try:
        a = ring.alloc(40)
        b = ring.alloc(40)
        assert (a, b) == (0, 40)
        ring.free(a)
        c = ring.alloc(30)  # does not fit at the end (80+30 > 100): wraps to 0, before b
        assert c == 0
        ring.free(b)
        ring.free(c)
        assert ring.alloc(100) == 0
    finally:
        ring.close()
