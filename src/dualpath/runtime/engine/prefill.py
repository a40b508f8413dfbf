"""Prefill engine (PE): layerwise prefill over both KV read paths (spec section 4).

Per layer ``i`` of a batch: the batch's cached KV of layer ``i`` is put in the device staging slot
(PE read path: copied from the PE buffer, which the store reads filled with Full Blocks; DE read path:
Layer Blocks pulled from the DE buffer through the transport; split: copied from the PE buffer, which
holds the PE's share from the store and the DE's share pushed by the DE), the new tokens are
computed, and their KV goes to the DE buffer through the transport (PE path: the hit KV of that layer too, once;
split: the PE's share of it, the DE holding its own). With
``overlap`` the load of layer ``i + 1`` runs on a helper thread while layer ``i`` computes.

Driven step by step: ``add_request``, ``waiting()`` (what a ``BatchView`` needs), ``step(plan)``
with the entries of a policy ``BatchPlan`` (chunked prefill allowed). Not thread-safe: one driver.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import torch

from dualpath.core.errors import ConfigError, require
from dualpath.core.units import MiB
from dualpath.policy.views import BatchEntry, BatchItem, BatchPlan
from dualpath.runtime.engine.kvbuffer import KVBuffer, RequestBlocks, loaded_prefix_tokens
from dualpath.runtime.engine.sampling import sample_token
from dualpath.runtime.engine.staging import LayerStaging
from dualpath.runtime.engine.types import (
    KVGeometry,
    PrefillOutput,
    PrefillRequest,
    RemoteKV,
)  # fmt: skip
from dualpath.runtime.kvstore import IOEngine, ReadResult
from dualpath.runtime.model import Decoder, Span
from dualpath.runtime.transfer import TransferHandle, TransferItem, Transport


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillConfig:
    """``buffer_bytes``: PE DRAM buffer; ``max_cached_tokens``: staging capacity per layer slot, in
    tokens (a batch's cached + new tokens, each request padded to whole blocks);
    ``transfer_timeout_s``: the longest wait for one transfer (a layer load, a KV hand-off) before
    ``step`` raises ``TransferError``."""

    name: str = "pe0"
    block_size: int = 64
    buffer_bytes: int = 64 * MiB
    max_cached_tokens: int = 8192
    overlap: bool = True
    transfer_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        require(self.transfer_timeout_s > 0, "transfer_timeout_s", self.transfer_timeout_s, "> 0")
        require(self.max_cached_tokens >= 1, "max_cached_tokens", self.max_cached_tokens, ">= 1")


class _State:
    __slots__ = ("req", "hit_len", "computed_len", "sent_len", "blocks", "reads")

    def __init__(self, req: PrefillRequest) -> None:
        self.req = req
        self.hit_len: int | None = None if req.hit_hashes else 0
        self.computed_len = 0
        self.sent_len = 0
        self.blocks: RequestBlocks | None = None
        self.reads: list[Future[ReadResult]] = []


class PrefillEngine:
    """One prefill engine over one decoder (see module docstring)."""

    def __init__(
        self,
        decoder: Decoder,
        transport: Transport,
        io: IOEngine | None = None,
        config: PrefillConfig | None = None,
        remotes: Mapping[str, RemoteKV] | None = None,
    ) -> None:
        self.config = cfg = config or PrefillConfig()
        self.decoder = decoder
        self.transport = transport
        self.io = io
        self.geometry = KVGeometry.of(decoder.config, decoder.dtype, cfg.block_size)
        self.buffer = KVBuffer(self.geometry, cfg.buffer_bytes, name=f"{cfg.name}/buffer")
        slots = 2 if cfg.overlap else 1  # one layer computing (+ the next one loading)
        self.staging = LayerStaging(self.geometry, cfg.max_cached_tokens, decoder.device, slots)
        self._remotes: dict[str, RemoteKV] = dict(remotes or {})
        self._reqs: dict[str, _State] = {}
        self._loader = ThreadPoolExecutor(1, thread_name_prefix=f"{cfg.name}-load")
        transport.bind(cfg.name, self.staging)
        self.buffer_endpoint = f"{cfg.name}.buffer"  # where a DE pushes its share of a split read
        transport.bind(self.buffer_endpoint, self.buffer)

    def connect(self, endpoint: str, remote: RemoteKV) -> None:
        """Register the DE behind ``endpoint`` for DE-path and split reads."""
        self._remotes[endpoint] = remote

    # ----- admission ---------------------------------------------------------------------------
    def add_request(self, req: PrefillRequest) -> bool:
        """Accept a request; on the PE and split paths start reading its hit blocks into the PE
        buffer (split: the PE's share from the store, the DE's share pushed by the DE).

        Returns False (nothing changed) when the PE buffer has no room for its prompt now."""
        if req.request_id in self._reqs:
            raise ConfigError("request_id", req.request_id, "already on this prefill engine")
        req = _with_hits(req, req.hit_hashes[: self.geometry.max_hit_blocks(len(req.token_ids))])
        hits, rid = req.hit_hashes, req.request_id
        local = hits[: req.split_block] if req.read_side == "split" else hits
        if (req.read_side == "de" or len(local) < len(hits)) and req.decode_endpoint not in self._remotes:
            raise ConfigError(
                "decode_endpoint", req.decode_endpoint, f"not connected for {req.read_side}-path reads"
            )
        st = _State(req)
        if req.read_side != "de":
            if local and self.io is None:
                raise ConfigError("io", None, "PE-path hits need an IOEngine on the prefill engine")
            blocks = self.buffer.allocate(rid, len(req.token_ids))
            if blocks is None:
                return False
            st.blocks = blocks
            if local:
                st.reads = self.buffer.load_from_store(rid, local, self.io)  # type: ignore[arg-type]
            if len(local) < len(hits):  # split: the DE pushes the rest into the buffer
                remote = self._remotes[req.decode_endpoint]
                st.reads += remote.pushed_share(rid, len(local), hits[len(local) :], self.buffer_endpoint)
        self._reqs[rid] = st
        return True

    def _ready(self, st: _State) -> bool:
        if st.hit_len is not None:
            return True
        if st.req.read_side == "de":
            st.hit_len = self._remotes[st.req.decode_endpoint].loaded_hit_tokens(st.req.request_id)
        else:
            st.hit_len = loaded_prefix_tokens(st.reads, self.geometry.block_size)
        if st.hit_len is not None:
            st.computed_len = st.hit_len
        return st.hit_len is not None

    def waiting(self) -> list[BatchItem]:
        """Requests ready to compute (hits loaded), FIFO: the ``waiting`` of a policy BatchView
        (``started``: a chunk of it was computed here already)."""
        return [
            BatchItem(
                request_id=rid,
                cached_len=st.computed_len,
                new_len=len(st.req.token_ids) - st.computed_len,
                started=st.computed_len > (st.hit_len or 0),
            )  # fmt: skip
            for rid, st in self._reqs.items()
            if self._ready(st)
        ]

    def hit_reads(self, request_id: str) -> list[Future[ReadResult]]:
        """The request's hit-block reads into the PE buffer, in block order (split: the PE's share,
        then the DE's); empty on the DE path."""
        return list(self._reqs[request_id].reads)

    @property
    def num_requests(self) -> int:
        return len(self._reqs)

    def abort(self, request_id: str) -> None:
        """Drop a request and free its PE buffer slots (waits for its reads)."""
        st = self._reqs.pop(request_id, None)
        if st is not None:
            for f in st.reads:
                f.exception()
            self.buffer.free(request_id)

    # ----- one iteration -----------------------------------------------------------------------
    def step(self, plan: BatchPlan | Iterable[BatchEntry]) -> list[PrefillOutput]:
        """Compute ``chunk_len`` new tokens of each entry, layer by layer; return finished prompts."""
        entries = list(plan.entries if isinstance(plan, BatchPlan) else plan)
        batch = [(self._checked(e), e.chunk_len) for e in entries]
        if not batch:
            return []
        spans = [Span(st.computed_len, n) for st, n in batch]
        ids = [t for st, n in batch for t in st.req.token_ids[st.computed_len : st.computed_len + n]]
        dec = self.decoder
        hidden = dec.embed(ids)
        rope = dec.rope(dec.positions(spans))
        handles: list[TransferHandle] = []
        # the last layer's output is needed only at the last token of the prompts that finish here
        finishing = [st.computed_len + n == len(st.req.token_ids) for st, n in batch]
        self._load(0, batch)
        for layer in range(dec.num_layers):
            nxt = layer + 1 < dec.num_layers
            pending = None
            if nxt and self.config.overlap:
                pending = self._loader.submit(self._load, layer + 1, batch)
            self.staging.wait_loaded(layer)
            cached = [self.staging.work_view(layer, st.req.request_id) if st.computed_len else None
                      for st, _ in batch]  # fmt: skip
            hidden, kv = dec.run_layer(layer, hidden, spans, cached, rope, cache_has_room=True,
                                       keep_last=None if nxt else finishing)  # fmt: skip
            handles.extend(self._emit(layer, batch, kv))
            if pending is not None:
                pending.result()
            elif nxt:
                self._load(layer + 1, batch)
        for h in handles:
            h.wait(self.config.transfer_timeout_s)
        return self._finish(batch, hidden)

    def _checked(self, e: BatchEntry) -> _State:
        st = self._reqs.get(e.request_id)
        if st is None or not self._ready(st):
            raise ConfigError("request_id", e.request_id, "not a ready request of this prefill engine")
        left = len(st.req.token_ids) - st.computed_len
        require(1 <= e.chunk_len <= left, "chunk_len", e.chunk_len, f"must be in [1, {left}]")
        require(e.cached_len == st.computed_len, "cached_len", e.cached_len,
                f"engine has {st.computed_len} cached tokens for {e.request_id!r}")  # fmt: skip
        return st

    def _load(self, layer: int, batch: Sequence[tuple[_State, int]]) -> None:
        """Put ``layer``'s cached KV of every batch entry into the staging slot of ``layer``; on the PE
        path also forward the not yet sent cached KV of that layer to the DE buffer (off the compute
        thread when overlapped)."""
        self.staging.arrange(layer, [(st.req.request_id, st.computed_len, n) for st, n in batch])
        with self.staging.loading(layer):
            self._load_into_staging(layer, batch)

    def _load_into_staging(self, layer: int, batch: Sequence[tuple[_State, int]]) -> None:
        handles = []
        for st, _ in batch:
            c, rid = st.computed_len, st.req.request_id
            if c == 0:
                continue
            if st.blocks is not None:  # PE read path: PE buffer -> device, and hit KV -> DE buffer
                st.blocks.read_tokens(layer, 0, c, self.staging.padded_view(layer, rid))
                # spec section 4: the PE path forwards the hit KV (from HBM) too; a split only its
                # own share: the DE read the rest into its buffer itself (it pushed it here)
                own = st.req.split_block * self.geometry.block_size if st.req.read_side == "split" else c
                stop = min(c, own) if st.sent_len < own else c
                if st.sent_len < stop:
                    item = _span_item(rid, layer, st.sent_len, self.staging.view(layer, rid)[st.sent_len : stop],
                                      self.geometry.block_size)  # fmt: skip
                    dest = st.req.decode_endpoint
                    handles.append(self.transport.submit(dest, [item], source=self.config.name))
            else:  # DE read path: DE buffer -> transport -> this engine's staging
                remote = self._remotes[st.req.decode_endpoint]
                handles.append(remote.request_layer(rid, layer, 0, c, self.config.name))
        for h in handles:
            h.wait(self.config.transfer_timeout_s)

    def _emit(
        self, layer: int, batch: Sequence[tuple[_State, int]], kv: torch.Tensor
    ) -> list[TransferHandle]:
        """Send ``layer``'s new KV to each request's DE buffer (one submit per destination)."""
        by_dest: dict[str, list[TransferItem]] = {}
        off, bs = 0, self.geometry.block_size
        for st, n in batch:
            rid, c, new = st.req.request_id, st.computed_len, kv[off : off + n]
            off += n
            items = by_dest.setdefault(st.req.decode_endpoint, [])
            if st.blocks is not None and c + n < len(st.req.token_ids):
                st.blocks.write_tokens(layer, c, new)  # later chunks read it back from the PE buffer
            items.append(_span_item(rid, layer, c, new, bs))
        return [self.transport.submit(dest, items, source=self.config.name)
                for dest, items in by_dest.items()]  # fmt: skip

    def _finish(self, batch: Sequence[tuple[_State, int]], hidden: torch.Tensor) -> list[PrefillOutput]:
        """``hidden``: one row per finishing prompt (its last token), in batch order."""
        outs, row = [], 0
        for st, n in batch:
            st.computed_len += n
            st.sent_len = st.computed_len
            if st.computed_len < len(st.req.token_ids):
                continue
            logits = self.decoder.final(hidden[row : row + 1])[0]
            row += 1
            rid = st.req.request_id
            outs.append(PrefillOutput(request_id=rid, first_token=sample_token(logits, st.req.sampling, st.req.first_step),
                                      logits=logits, hit_tokens=st.hit_len or 0,
                                      computed_tokens=len(st.req.token_ids) - (st.hit_len or 0)))  # fmt: skip
            del self._reqs[rid]
            self.buffer.free(rid)
        return outs

    def close(self) -> None:
        self._loader.shutdown(wait=True)


def _with_hits(req: PrefillRequest, hits: tuple[str, ...]) -> PrefillRequest:
    """``req`` with only the ``hits`` it may load (a split whose DE share is cut off reads "pe")."""
    if hits == req.hit_hashes:
        return req
    split = req.read_side == "split" and req.split_block < len(hits)
    return replace(
        req,
        hit_hashes=hits,
        read_side="split" if split else ("pe" if req.read_side == "split" else req.read_side),
        split_block=req.split_block if split else 0,
    )


def _span_item(rid: str, layer: int, start: int, kv: torch.Tensor, block_size: int) -> TransferItem:
    """One item carrying tokens ``[start, start + len(kv))`` of ``layer`` (may span several blocks)."""
    block, off = divmod(start, block_size)
    return TransferItem(key=rid, block_index=block, layer=layer, num_tokens=kv.shape[0],
                        token_offset=off, payload=kv)  # fmt: skip
