"""Storage reads and writes, and the bounded DRAM buffer of each node.

A *claim* asks a node's DRAM buffer for ``nbytes`` and optionally reads ``read_tokens`` hit tokens
from storage into it (spec section 4, steps (1)(2): storage -> SNIC -> DRAM). Claims are admitted
in FIFO order per node while the buffer has room (a claim larger than the whole buffer is admitted
alone); an admitted read is a transfer on the node's SNIC and DRAM links. ``read_q`` counts the
tokens of claims queued or reading, as the scheduler sees it. Writes (decode persistence) go DRAM
-> SNIC and share the SNIC with reads. Nothing here decides anything; callbacks go to the driver.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from dualpath.sim.kernel import PRIO_COMPLETE, Kernel
from dualpath.sim.links import transfer2

if TYPE_CHECKING:
    from dualpath.sim.cluster import Node
    from dualpath.sim.request import Req


class Claim:
    __slots__ = ("req", "nbytes", "read_tokens", "on_admit", "on_done", "limit_frac")

    def __init__(
        self,
        req: Req,
        nbytes: float,
        read_tokens: int,
        on_admit: Callable[[Req], None] | None,
        on_done: Callable[[Req], None],
        limit_frac: float = 1.0,
    ) -> None:
        self.limit_frac = limit_frac
        self.req = req
        self.nbytes = nbytes
        self.read_tokens = read_tokens
        self.on_admit = on_admit
        self.on_done = on_done


class Storage:
    """Per-node buffer gates (``gates[node_id]``: the FIFO of claims waiting for room) and storage
    traffic. ``bytes_read`` is checked against hit tokens."""

    def __init__(
        self,
        kernel: Kernel,
        nodes: list[Node],
        kv_bytes_per_token: int,
        *,
        read_latency_s: float = 0.0,
        alloc_s: float = 0.0,
    ) -> None:
        """``read_latency_s``: per-read storage latency on top of bandwidth; ``alloc_s``: time to
        allocate an admitted claim's buffer room before its read starts (sim/calibration.py)."""
        self.kernel = kernel
        self.read_latency_s = read_latency_s
        self.alloc_s = alloc_s
        self.nodes = nodes
        self.bpt = kv_bytes_per_token
        self.bytes_read = 0.0
        self.peak_buffer = [0.0] * len(nodes)
        self.gates: list[deque[Claim]] = [deque() for _ in nodes]

    def claim(
        self,
        node: Node,
        req: Req,
        nbytes: float,
        read_tokens: int,
        on_done: Callable[[Req], None],
        on_admit: Callable[[Req], None] | None = None,
        limit_frac: float = 1.0,
    ) -> None:
        """Queue a buffer claim (and read). ``on_admit(req)`` runs when the buffer room is granted,
        ``on_done(req)`` once its read is in DRAM (at admission if there is nothing to read).
        ``limit_frac``: admit only while the buffer stays under this fraction of its size."""
        node.read_q += read_tokens
        gate = self.gates[node.node_id]
        gate.append(Claim(req, nbytes, read_tokens, on_admit, on_done, limit_frac))
        if len(gate) == 1:
            self._pump(node)

    def try_reserve(self, node: Node, nbytes: float) -> bool:
        """Take buffer room now if there is some (no queueing); True on success."""
        if node.buffer_used + nbytes > node.buffer_bytes and node.buffer_used > 0:
            return False
        node.buffer_used += nbytes
        if node.buffer_used > self.peak_buffer[node.node_id]:
            self.peak_buffer[node.node_id] = node.buffer_used
        return True

    def release(self, node: Node, nbytes: float) -> None:
        node.buffer_used -= nbytes
        if node.buffer_used < 1e-6:
            node.buffer_used = 0.0
        if self.gates[node.node_id]:
            self._pump(node)

    def _pump(self, node: Node) -> None:
        gate = self.gates[node.node_id]
        cap = node.buffer_bytes
        while gate:
            claim = gate[0]
            if node.buffer_used + claim.nbytes > cap * claim.limit_frac and node.buffer_used > 0:
                return
            gate.popleft()
            node.buffer_used += claim.nbytes
            if node.buffer_used > self.peak_buffer[node.node_id]:
                self.peak_buffer[node.node_id] = node.buffer_used
            start = self.kernel.now_s + self.alloc_s
            claim.req.t_alloc = start
            if claim.on_admit is not None:
                claim.on_admit(claim.req)
            if claim.read_tokens > 0:
                nbytes = claim.read_tokens * self.bpt
                end = transfer2(node.snic, node.dram, nbytes, start) + self.read_latency_s
                node.snic_read_bytes += nbytes
                self.bytes_read += nbytes
                self.kernel.call_at(end, partial(self._read_done, node, claim), PRIO_COMPLETE)
            else:
                claim.on_done(claim.req)

    def _read_done(self, node: Node, claim: Claim) -> None:
        node.read_q -= claim.read_tokens
        claim.on_done(claim.req)

    def queued_read_tokens(self) -> int:
        """Hit tokens of claims still waiting for buffer room (not read yet)."""
        return sum(c.read_tokens for gate in self.gates for c in gate)

    def write(self, node: Node, nbytes: float) -> float:
        """Persist ``nbytes`` of full blocks from this node (DRAM -> SNIC -> storage); returns
        when every persist of this node booked so far is done (``node.persist_end_s``)."""
        if nbytes > 0:
            end = transfer2(node.dram, node.snic_tx, nbytes, self.kernel.now_s)
            node.snic_write_bytes += nbytes
            if end > node.persist_end_s:
                node.persist_end_s = end
        return node.persist_end_s
