"""``DualPathConnector``: a vLLM v1 KV connector over DualPath's block store.

Load it with::

    --kv-transfer-config '{"kv_connector": "DualPathConnector",
      "kv_connector_module_path": "dualpath.integrations.vllm.connector", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"store_dir": "/path/to/kvstore"}}'

Scheduler side (``RequestTracker``): the hit of a request is the longest prefix of whole store
blocks of its tokens found in the store (chain hashes, as ``dualpath serve`` indexes them), less the
last prompt token; blocks are saved once complete, in prefill and as decode fills them. Worker side:
``start_load_kv`` starts a thread reading the hit's Layer Blocks layer by layer (checksummed) while
``wait_for_layer_load`` copies layer ``i`` into vLLM's paged cache just before layer ``i`` runs;
``save_kv_layer`` copies the step's finished blocks of each layer out of the paged cache (one
``index_select`` per layer into a layer-major staging buffer) and ``wait_for_save`` hands them to
the writer thread (``savewrite.py``), which writes them as Full Blocks after the step (atomic
rename, crc32 per layer); blocks of P/D requests are written before the step ends. A block that
fails to read (vanished, corrupt) is reported with ``get_block_ids_with_load_errors`` and
recomputed from there: a miss, never served. See docs/vllm.md.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from dualpath.integrations.vllm.hitload import HitLoader
from dualpath.integrations.vllm.kvcopy import PagedLayer
from dualpath.integrations.vllm.plan import BlockSizes, LoadSpec, RequestTracker, SaveSpec
from dualpath.integrations.vllm.savewrite import SaveWriter
from dualpath.integrations.vllm.settings import (
    ConnectorSettings,
    ReadSource,
    layer_index,
    read_source,
    saves_in_step,
)
from dualpath.integrations.vllm.stepsave import StepSaves, plan_step_saves
from dualpath.runtime.kvstore import BlockLayout, BlockStore

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


@dataclass
class DualPathMetadata(KVConnectorMetadata):
    """What the workers load and save in one step (built by the scheduler side)."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


class DualPathConnector(KVConnectorBase_V1):
    """vLLM v1 connector: prefix hits, layerwise load and save through DualPath's block store."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:  # fmt: skip
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        vllm_block = int(vllm_config.cache_config.block_size)
        self.settings = ConnectorSettings.from_extra(extra, vllm_block_size=vllm_block)
        self.sizes = BlockSizes(vllm_block_size=vllm_block, store_block_size=self.settings.block_size)
        mc, pc = vllm_config.model_config, vllm_config.parallel_config
        self.num_layers = int(mc.get_num_layers(pc))
        self.num_kv_heads = int(mc.get_num_kv_heads(pc))
        self.head_dim = int(mc.get_head_size())
        itemsize = torch.empty((), dtype=mc.dtype).element_size()
        layout = BlockLayout(
            num_layers=self.num_layers,
            block_size=self.sizes.store_block_size,
            kv_bytes_per_token_layer=2 * self.num_kv_heads * self.head_dim * itemsize,
        )
        self.store = BlockStore(self.settings.store_dir, layout, self.settings.capacity_bytes,
                                verify=self.settings.verify)  # fmt: skip
        self.tracker = RequestTracker(self.sizes)
        self._hit_tokens: dict[str, int] = {}
        self._layers: dict[str, tuple[int, PagedLayer]] = {}
        self._sources: dict[str, ReadSource] = {}
        self.snic_in, self.snic_out = self.settings.snic_limiters()
        # worker-side time: steps by kind (with a load, with only saves, neither) and their wall
        # time from start_load_kv to the end of the step; time blocked on layer loads; saves
        self.timing = {f"{k}_{u}": 0 for k in ("load", "save", "plain") for u in ("steps", "step_s")}
        self.timing.update(load_wait_s=0.0, save_gather_s=0.0, save_write_s=0.0, save_flush_wait_s=0.0)
        self._step: tuple[float, bool, bool] | None = None
        self._forwarded = False  # a layer ran in this step (else a no-forward step)
        self.loader = HitLoader(self.store, self.sizes, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                                limiter=self.snic_in, on_done=self._write_counters)  # fmt: skip
        self._saves: StepSaves | None = None
        self.writer = SaveWriter(self.store, limiter=self.snic_out, on_written=self._write_counters)
        self.counters = {"hit_tokens": 0, "dropped_saves": 0}
        atexit.register(self.writer.close)  # (vLLM may exit without calling shutdown)
        log.info(
            "DualPathConnector (%s): store %s, store block %d tokens = %d vLLM blocks",
            role.name,
            self.settings.store_dir,
            self.sizes.store_block_size,
            self.sizes.ratio,
        )

    # ----- scheduler side ----------------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tokens = list(request.all_token_ids)
        size = self.sizes.store_block_size
        loadable = (len(tokens) - 1) // size * size  # the last token is always computed
        hit = self.store.match_prefix(tokens[:loadable]) if loadable else []
        # blocks this instance saved that its writer may still be writing count as hits: the worker
        # waits for them before it reads them (start_load_kv)
        hit = self.tracker.extend_hit(tokens[:loadable], hit, self.store.contains)
        self.tracker.admit(request.request_id, lambda: request.all_token_ids,
                           saves_in_step=saves_in_step(request.kv_transfer_params))  # fmt: skip
        self.tracker.set_hit(request.request_id, hit)
        self._hit_tokens[request.request_id] = len(hit) * size
        self._sources[request.request_id] = read_source(request.request_id, request.kv_transfer_params)
        n = max(0, len(hit) * size - num_computed_tokens)
        return n, self.settings.load == "async" and n > 0

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:  # fmt: skip
        rid = request.request_id
        if rid not in self.tracker:
            return
        block_ids = blocks.get_block_ids()[0]
        src = self._sources.pop(rid, ReadSource())
        self.tracker.plan_load(rid, block_ids, num_external_tokens, self._hit_tokens.pop(rid, 0), src.agent_url,
                               src.capped, async_load=self.settings.load == "async",
                               agent_from=src.agent_from)  # fmt: skip

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = DualPathMetadata(loads=self.tracker.take_async_loads())
        steps: list[tuple[str, int]] = []
        for new in scheduler_output.scheduled_new_reqs:
            self.tracker.set_blocks(new.req_id, new.block_ids[0], replace=True)
            steps.append((new.req_id, new.num_computed_tokens))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            self.tracker.set_blocks(rid, None if new_ids is None else new_ids[0],
                                    replace=rid in cached.resumed_req_ids)  # fmt: skip
            steps.append((rid, cached.num_computed_tokens[i]))
        for rid, computed in steps:
            load, save = self.tracker.step_specs(rid, computed + scheduler_output.num_scheduled_tokens[rid])
            if load is not None:
                meta.loads.append(load)
                self.counters["hit_tokens"] += load.end_token - load.start_token
            if save is not None:
                meta.saves.append(save)
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        stored = self.tracker.finish(request.request_id)
        self._hit_tokens.pop(request.request_id, None)
        self._sources.pop(request.request_id, None)
        # nothing is held: saves are copied out of the paged cache within the step. A P/D request's
        # blocks are written before its step ends (saves_in_step), so the decode request sent on
        # with these params (the proxy) finds the prompt's whole blocks in the store
        return False, {"dualpath": {"stored_tokens": stored * self.sizes.store_block_size}}

    # ----- worker side -------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        for name, cache in kv_caches.items():
            layer = PagedLayer.of(cache, block_size=self.sizes.vllm_block_size,
                                  num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)  # fmt: skip
            self._layers[name] = (layer_index(name), layer)
            self.loader.layers[layer_index(name)] = layer
        log.info(
            "DualPathConnector: %d layers, %s layout %s",
            len(self._layers),
            next(iter(self._layers.values()))[1].kind,
            tuple(next(iter(kv_caches.values())).shape),
        )

    def _meta(self) -> DualPathMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, DualPathMetadata), type(meta)
        return meta

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        meta = self._meta()  # the start of a worker step (before its forward)
        if self._saves is not None:  # (a step whose wait_for_save never came: not written)
            self.counters["dropped_saves"] += len(self._saves.in_step) + len(self._saves.after)
            self.writer.pool.give(self._saves.buf)
            self._saves = None
        self._step = (time.perf_counter(), bool(meta.loads), bool(meta.saves))

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        loads = self._meta().loads
        if loads:
            t = time.perf_counter()  # a hit on blocks the writer has not finished: wait for them
            if not self.writer.wait_for((h for load in loads for h in load.hashes), timeout_s=60.0):
                log.error("DualPathConnector: the save writer did not finish a hit's blocks in 60 s; "
                          "reading anyway (a block not on disk is a miss, recomputed)")  # fmt: skip
            self.timing["save_flush_wait_s"] += time.perf_counter() - t
            self.loader.start(loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._forwarded = True
        if layer_name in self._layers:
            t = time.perf_counter()
            self.loader.wait_layer(self._layers[layer_name][0])
            self.timing["load_wait_s"] += time.perf_counter() - t

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        # async loads: those requests may now be scheduled; a step with no forward (every request
        # waits for its KV) waits a little for one, instead of vLLM stepping in a busy loop
        idle = not self._forwarded
        done = self.loader.finished(idle_wait_s=0.05 if idle else 0.0)
        return None, done or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        out = self.loader.errors()
        if self._step is not None:  # the end of a step (after its forward and saves): timings
            t0, loads, saves = self._step
            kind = "load" if loads else "save" if saves else "plain"
            self.timing[f"{kind}_steps"] += 1
            self.timing[f"{kind}_step_s"] += time.perf_counter() - t0
            self._step, self._forwarded = None, False
            if self.settings.counters_file is not None and (loads or saves):
                self._write_counters()
        return out

    def _write_counters(self) -> None:
        path = self.settings.counters_file
        if path is None:
            return
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # (the async load thread writes too)
        with open(tmp, "w") as f:
            timing = {**self.timing, **self.writer.timing}
            json.dump({**self.counters, **self.writer.counters, **self.loader.counters, "timing": timing}, f)
        os.replace(tmp, path)  # the node agent's /metrics reads it whole

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:  # fmt: skip
        self._forwarded = True
        if layer_name not in self._layers:
            return
        saves = self._saves
        if saves is None:
            specs = self._meta().saves
            if not specs:
                return
            t = time.perf_counter()
            saves = self._saves = plan_step_saves(
                specs, self.sizes.ratio, self.store.layout, self.writer.pool
            )
            self.timing["save_gather_s"] += time.perf_counter() - t
        t = time.perf_counter()
        layer, paged = self._layers[layer_name]
        out = torch.from_numpy(saves.stage[layer].reshape(-1)).view(paged.cache.dtype)
        paged.gather_into(saves.vllm_ids, out)  # every block of the step: one copy
        saves.layers.add(layer)
        self.timing["save_gather_s"] += time.perf_counter() - t

    def wait_for_save(self) -> None:
        saves, self._saves = self._saves, None
        if saves is None:
            return
        if len(saves.layers) != self.num_layers:  # a layer never came: never write such a block
            log.error("DualPathConnector: a step gathered %d of %d layers; its %d blocks are not saved",
                      len(saves.layers), self.num_layers, len(saves.in_step) + len(saves.after))  # fmt: skip
            self.counters["dropped_saves"] += len(saves.in_step) + len(saves.after)
            self.writer.pool.give(saves.buf)
            return
        t = time.perf_counter()
        self.writer.write(saves.stage, saves.in_step)  # read by another instance once we answer
        self.writer.submit(saves.stage, saves.after, saves.buf)  # after the step (returns buf)
        self.timing["save_write_s"] += time.perf_counter() - t

    def shutdown(self) -> None:
        if not self.writer.close():
            log.error("DualPathConnector: the save writer did not finish (%d bytes pending)",
                      self.writer.pending_bytes)  # fmt: skip
        self.loader.close()
        if self.role == KVConnectorRole.WORKER:  # (the scheduler side's counters are not the worker's)
            self._write_counters()
        log.info("DualPathConnector (%s): %s %s %s", self.role.name, self.counters, self.loader.counters,
                 self.timing)  # fmt: skip
