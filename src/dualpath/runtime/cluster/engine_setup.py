"""The parts an engine process is built from: its model (``load_model``, or a standby's, loaded
already), the block store's capacity, the traffic manager of its links, the transport sink that
holds KV until the worker exists (``SinkGate``), a PE's policy knobs (``sched_config``) and a
Configure applied to a running engine. ``engine_main.py`` puts them together.
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING

import torch

from dualpath.runtime.cluster.config import EngineArgs
from dualpath.runtime.cluster.kvio import Geometry
from dualpath.runtime.cluster.messages import Configure
from dualpath.runtime.cluster.traffic import TrafficManager, links_dir

if TYPE_CHECKING:
    from dualpath.policy import SchedulerConfig
    from dualpath.runtime.cluster.memory import KVPools


def store_capacity(args: EngineArgs) -> int | None | str:
    return "auto" if args.kv_capacity_bytes is None else args.kv_capacity_bytes


def load_model(args: EngineArgs) -> tuple[object, Geometry, int | None, int, int]:
    """The engine's decoder: mapped from the host's shared packed weights when ``weights_dir`` is
    set (``model/packed.py``; the first engine converts the checkpoint), else its own copy."""
    from dualpath.runtime.cluster.memory import release_freed_memory

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.cluster.engine.dtype]

    def build() -> tuple[object, dict[str, object]]:
        from dualpath.runtime.model import load_decoder

        decoder, ckpt = load_decoder(args.cluster.model, device="cpu", dtype=dtype)
        eos = getattr(ckpt.hf_config, "eos_token_id", None)
        return decoder, {"eos_token_id": eos[0] if isinstance(eos, list) else eos}

    if args.weights_dir:
        from dualpath.runtime.model.packed import shared_decoder

        key = hashlib.sha256(f"{args.cluster.model}|{args.cluster.engine.dtype}".encode()).hexdigest()[:16]
        decoder, extra = shared_decoder(args.weights_dir, key, build)  # type: ignore[arg-type]
    else:
        decoder, extra = build()
    release_freed_memory()  # the loader's transient copies
    c = decoder.config  # type: ignore[attr-defined]
    geo = Geometry.of(decoder, args.cluster.engine.block_size)  # type: ignore[arg-type]
    return decoder, geo, extra["eos_token_id"], c.vocab_size, c.max_position_embeddings  # type: ignore[return-value]


Loaded = tuple[object, Geometry, "int | None", int, int]  # what load_model returns


def make_traffic(args: EngineArgs, engine_id: int) -> TrafficManager:
    t = args.cluster.traffic
    return TrafficManager(
        engine_id=engine_id,
        node_id=args.node_id,
        snic_gbps=t.snic_gbps,
        cnic_gbps=t.cnic_gbps,
        shared_dir=links_dir(args.cluster_id),
        read_free=t.read_free,
        snic_directions=t.snic_directions,
    )


class SinkGate:
    """The engine's transport sink (KV and control messages): waits (on the receive thread) until
    the worker is built."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._sink: object = None

    def open(self, sink: object) -> None:
        self._sink = sink
        self._ready.set()

    def deliver(self, source: str, items: object) -> None:
        if not self._ready.wait(120.0):
            raise RuntimeError("engine worker not ready")
        self._sink.deliver(source, items)  # type: ignore[attr-defined]

    def control(self, source: str, msgs: object) -> None:
        if not self._ready.wait(120.0):
            raise RuntimeError("engine worker not ready")
        self._sink.control(source, msgs)  # type: ignore[attr-defined]


def sched_config(args: EngineArgs, decoder: object) -> SchedulerConfig:
    """A PE's policy knobs: the measured whole-forward time predictor (``quota_scope``
    "forward"), or the measured or fixed whole-forward attention predictor, and the quota for
    dualpath*'s "quota" batching; the token budget for the baselines' "tokens" batching (the
    policy's registry picks the mode)."""
    from dualpath.policy import AttentionTimePredictor, SchedulerConfig
    from dualpath.runtime.engine.profile import attention_predictor, fixed_predictor, forward_predictor

    eng, fixed = args.cluster.engine, None
    quota = f"quota {eng.compute_quota_s * 1e3:.0f} ms"
    if eng.attention_s_per_gflop > 0:
        fixed = fixed_predictor(
            decoder,
            seconds_per_gflop=eng.attention_s_per_gflop,  # type: ignore[arg-type]
            intercept_s=eng.attention_intercept_s,
        )
    pred: AttentionTimePredictor
    if fixed is None and eng.quota_scope == "forward":
        pred = fwd = forward_predictor(decoder)  # type: ignore[arg-type]
        print(f"forward-time predictor (measured): {fwd.seconds_per_token * 1e3:.3f} ms/token, "
              f"{fwd.seconds_per_flop * 1e9:.4f} s/GFLOP of attention, intercept {fwd.intercept_s * 1e3:.3f} ms "
              f"per forward of {fwd.num_layers} layers; {quota} of forward time", flush=True)  # fmt: skip
    else:
        pred = att = attention_predictor(decoder, fixed=fixed)  # type: ignore[arg-type]
        print(f"attention predictor ({'fixed' if fixed else 'measured'}): {att.seconds_per_gflop:.4f} s/GFLOP, "
              f"intercept {att.intercept_s * 1e3:.3f} ms per forward of {att.num_layers} layers; {quota}",
              flush=True)  # fmt: skip
    return SchedulerConfig(
        compute_quota_s=args.cluster.engine.compute_quota_s,
        attention_predictor=pred,
        max_batch_tokens=args.cluster.engine.max_batch_tokens,
        block_size=args.cluster.engine.block_size,
    )


def apply_configure(msg: Configure, worker: object, traffic: TrafficManager) -> None:
    """Apply the settings ``msg`` names (None keeps one; ``reset`` returns one to its default)."""
    from dualpath.policy import make_scheduler
    from dualpath.runtime.cluster.config import DEFAULT_POLICY

    if msg.read_free is not None or "read_free" in msg.reset:
        traffic.read_free = bool(msg.read_free)
    if msg.snic_gbps is not None or "snic_gbps" in msg.reset:
        traffic.set_snic_gbps(msg.snic_gbps)
    policy = DEFAULT_POLICY if "policy" in msg.reset else msg.policy
    if policy is not None and hasattr(worker, "scheduler"):  # same knobs and fitted predictor
        worker.scheduler = make_scheduler(policy, worker.scheduler.config)
    cap = traffic.snic.rate_bytes_per_s
    print(
        f"engine {traffic.engine_id}: settings: policy {policy or 'unchanged'}, read_free {traffic.read_free}, "
        f"snic {'uncapped' if cap is None else f'{cap * 8 / 1e9:g} Gbit/s'}",
        flush=True,
    )


def engine_pools(role: str, spec: str, geo: Geometry, max_context: int) -> KVPools:
    """The KV pools of a ``role`` engine under the budget ``spec`` (``--kv-cache-memory``)."""
    from dualpath.runtime.cluster.memory import resolve_memory, size_pools

    layout = geo.layout()
    return size_pools(
        role,
        resolve_memory(spec, layout.kv_bytes_per_token),
        block_size=geo.block_size,
        block_bytes=layout.full_block_bytes,
        num_layers=geo.num_layers,
        max_context=max_context,
    )
