"""Scheduler-side bookkeeping of the DualPath vLLM connector. No vLLM or torch import: plain data.

Block sizes: the store's block (``store_block_size`` tokens, the unit of its chain hashes) is a whole
number ``k`` of vLLM's blocks (``vllm_block_size``), so every store hit ends on a vLLM block boundary
and one store block is read into, or written from, exactly ``k`` vLLM blocks.

Per request the tracker keeps the vLLM block ids (from the scheduler output), the chain hashes of
its whole store blocks as they fill, and how many of those are known to be in the store. Each step
``step_specs`` says which store blocks to load (the hit found at admission) and which to save (whole
blocks whose KV is complete after this step and not yet in the store), in prompt and in decode.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from dualpath.core.errors import require
from dualpath.runtime.kvstore.layout import block_hash

PROMISED_KEEP = 4096  # hashes sent to the worker's writer thread remembered as hits


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockSizes:
    """The vLLM block size and the store's; the store's is ``ratio`` vLLM blocks."""

    vllm_block_size: int
    store_block_size: int

    def __post_init__(self) -> None:
        require(self.vllm_block_size >= 1, "vllm_block_size", self.vllm_block_size, "must be >= 1")
        require(self.store_block_size >= self.vllm_block_size
                and self.store_block_size % self.vllm_block_size == 0, "block_size",
                self.store_block_size,
                f"must be a whole multiple of vLLM's block size {self.vllm_block_size}")  # fmt: skip

    @property
    def ratio(self) -> int:
        return self.store_block_size // self.vllm_block_size


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    """Load tokens ``[start_token, end_token)`` of a request from store blocks ``hashes`` (the
    store blocks covering that span, in order; ``first_block`` is the index of ``hashes[0]``) into
    the request's vLLM blocks ``vllm_block_ids`` (the request's whole block table). ``agent_url``:
    the decode node's agent that reads and forwards them (DE read path); "" reads them here (PE).
    ``agent_from`` (with ``agent_url``): the prompt token from which the agent reads; the tokens
    before it are read here (a split read: the PE reads the prefix, the DE the rest, as
    ``dualpath serve`` splits; 0 reads all through the agent). ``capped``: the reads go through the
    emulated storage NICs (False: the no-I/O baseline)."""

    req_id: str
    hashes: tuple[str, ...]
    first_block: int
    start_token: int
    end_token: int
    vllm_block_ids: tuple[int, ...]
    agent_url: str = ""
    agent_from: int = 0
    capped: bool = True
    async_load: bool = False

    def parts(self, store_block_size: int) -> tuple[LoadSpec, ...]:
        """The load as reads of one side each, in token order: the tokens before ``agent_from``
        (cut down to a whole store block) read here, the rest through ``agent_url``. One part
        unless the load is split; every part has ``agent_from`` 0."""
        size = store_block_size
        cut = self.agent_from // size * size
        if not self.agent_url or cut >= self.end_token:
            return (replace(self, agent_url="", agent_from=0),)
        if cut <= self.start_token:
            return (replace(self, agent_from=0),)
        k = cut // size - self.first_block  # store blocks read here
        here = replace(self, hashes=self.hashes[:k], end_token=cut, agent_url="", agent_from=0)
        there = replace(self, hashes=self.hashes[k:], first_block=cut // size, start_token=cut, agent_from=0)
        return here, there


@dataclass(frozen=True, slots=True, kw_only=True)
class SaveSpec:
    """Write store blocks ``block_indices`` of a request (hash, parent hash and token ids each) from
    its vLLM blocks ``vllm_block_ids`` (its whole block table). ``in_step``: written before the step
    ends (another instance reads them next: P/D), else by the worker's writer thread after it."""

    req_id: str
    block_indices: tuple[int, ...]
    hashes: tuple[str, ...]
    parents: tuple[str | None, ...]
    token_ids: tuple[tuple[int, ...], ...]
    vllm_block_ids: tuple[int, ...]
    in_step: bool = False


@dataclass(slots=True)
class _Req:
    token_ids: Callable[[], Sequence[int]]  # the live request's prompt + output tokens
    saves_in_step: bool = False
    block_ids: list[int] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)  # chain hashes of whole store blocks so far
    num_stored: int = 0  # leading store blocks known to be in the store (hit or saved)
    pending_load: LoadSpec | None = None


class RequestTracker:
    """Per-request state of the scheduler-side connector (one vLLM scheduler thread; not locked)."""

    def __init__(self, sizes: BlockSizes) -> None:
        self.sizes = sizes
        self._reqs: dict[str, _Req] = {}
        self._async: list[LoadSpec] = []
        # hashes saved after their step (the worker's writer thread): maybe not on disk yet
        self._promised: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._reqs

    def hashes_for(self, token_ids: Sequence[int], req_id: str | None = None) -> list[str]:
        """Chain hashes of the whole store blocks of ``token_ids`` (extending a tracked request's)."""
        size = self.sizes.store_block_size
        known = self._reqs[req_id].hashes if req_id in self._reqs else []  # type: ignore[index]
        out = list(known[: len(token_ids) // size])
        parent = out[-1] if out else None
        for start in range(len(out) * size, len(token_ids) - size + 1, size):
            parent = block_hash(parent, list(token_ids[start : start + size]))
            out.append(parent)
        return out

    def extend_hit(
        self, token_ids: Sequence[int], hit: Sequence[str], on_disk: Callable[[str], bool]
    ) -> list[str]:
        """The store's hit ``hit`` (the chain hashes of the leading whole blocks of ``token_ids``
        found on disk) extended by the blocks this instance's saves sent to the writer thread
        (``SaveSpec.in_step`` False) that may not be written yet, and by blocks ``on_disk`` after
        them: the worker waits for its writer before it reads them. Blocks found on disk are
        forgotten here (at most ``PROMISED_KEEP`` are remembered)."""
        out = list(hit)
        for h in out:
            self._promised.pop(h, None)
        size = self.sizes.store_block_size
        if not self._promised or len(out) >= len(token_ids) // size:
            return out
        for h in self.hashes_for(token_ids)[len(out) :]:
            if h not in self._promised and not on_disk(h):
                break
            out.append(h)
        return out

    def admit(
        self, req_id: str, token_ids: Callable[[], Sequence[int]], *, saves_in_step: bool = False
    ) -> None:
        """Start tracking a request (idempotent: vLLM may ask for its hit more than once).
        ``saves_in_step``: its blocks are written within the step that completes them."""
        self._reqs.setdefault(req_id, _Req(token_ids=token_ids, saves_in_step=saves_in_step))

    def set_hit(self, req_id: str, hashes: Sequence[str]) -> None:
        """Record the store hit found at admission (blocks already in the store are never saved)."""
        r = self._reqs[req_id]
        r.hashes = list(hashes) if len(hashes) > len(r.hashes) else r.hashes
        r.num_stored = max(r.num_stored, len(hashes))

    def plan_load(self, req_id: str, block_ids: Sequence[int], num_external_tokens: int,
                  num_hit_tokens: int, agent_url: str = "", capped: bool = True,
                  async_load: bool = False, agent_from: int = 0) -> None:  # fmt: skip
        """After vLLM allocated ``block_ids``: load the last ``num_external_tokens`` of the hit
        (the tokens before it are vLLM's own prefix-cache hit), here or through ``agent_url``
        (from token ``agent_from`` on: ``LoadSpec.parts``)."""
        r = self._reqs[req_id]
        r.block_ids = list(block_ids)
        if num_external_tokens <= 0:
            return
        size = self.sizes.store_block_size
        start = num_hit_tokens - num_external_tokens
        first, last = start // size, (num_hit_tokens - 1) // size
        r.pending_load = LoadSpec(req_id=req_id, hashes=tuple(r.hashes[first : last + 1]),
                                  first_block=first, start_token=start, end_token=num_hit_tokens,
                                  vllm_block_ids=tuple(block_ids), agent_url=agent_url,
                                  agent_from=agent_from, capped=capped, async_load=async_load)  # fmt: skip
        if async_load:  # sent with the next step's metadata, whether or not the request runs in it
            self._async.append(r.pending_load)
            r.pending_load = None

    def set_blocks(self, req_id: str, block_ids: Sequence[int] | None, *, replace: bool) -> None:
        """New vLLM blocks of a running request (``replace``: the whole table, after preemption)."""
        if req_id not in self._reqs or block_ids is None:
            return
        r = self._reqs[req_id]
        r.block_ids = list(block_ids) if replace else r.block_ids + list(block_ids)

    def take_async_loads(self) -> list[LoadSpec]:
        """The async loads planned since the last call (their requests wait for them, unscheduled)."""
        out, self._async = self._async, []
        return out

    def step_specs(self, req_id: str, num_tokens_after: int) -> tuple[LoadSpec | None, SaveSpec | None]:
        """The load (once, the step after admission) and the saves of one scheduled step, given
        the tokens whose KV is complete at the end of it. Marks the saved blocks as stored."""
        r = self._reqs.get(req_id)
        if r is None:
            return None, None
        load, r.pending_load = r.pending_load, None
        size = self.sizes.store_block_size
        num_whole = min(num_tokens_after // size, len(r.block_ids) // self.sizes.ratio)
        if num_whole <= r.num_stored:
            return load, None
        tokens = r.token_ids()
        r.hashes = self.hashes_for(tokens[: num_whole * size], req_id)
        idx = tuple(range(r.num_stored, num_whole))
        save = SaveSpec(req_id=req_id, block_indices=idx, hashes=tuple(r.hashes[i] for i in idx),
                        parents=tuple(r.hashes[i - 1] if i else None for i in idx),
                        token_ids=tuple(tuple(tokens[i * size : (i + 1) * size]) for i in idx),
                        vllm_block_ids=tuple(r.block_ids), in_step=r.saves_in_step)  # fmt: skip
        r.num_stored = num_whole
        if not save.in_step:
            for h in save.hashes:
                self._promised[h] = None
                self._promised.move_to_end(h)
            while len(self._promised) > PROMISED_KEEP:
                self._promised.popitem(last=False)
        return load, save

    def finish(self, req_id: str) -> int:
        """Forget a request; returns how many of its leading store blocks are in the store."""
        r = self._reqs.pop(req_id, None)
        return 0 if r is None else r.num_stored
