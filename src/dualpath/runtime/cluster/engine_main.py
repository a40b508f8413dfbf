"""One engine process (prefill or decode): loads the model, opens the shared KV store, binds its
transport endpoint ``e<engine_id>``, registers with the scheduler and runs its main loop.

The main thread owns the scheduler socket and the compute; a heartbeat thread (own socket,
runtime/cluster/engine_beat.py) runs from the process's first moment, before torch is imported:
it reports the engine as loading (with its generation, the incarnation of its engine id) until it
registers, then load, read queue and byte counters every ``heartbeat_s`` even while a long batch
runs. The engine registers, builds its worker (KV pools allocated), then says it is ready (only
then does the scheduler route to it). When a restarted scheduler does not know the engine, the
engine drops its tasks and registers again with the same id. The heavy part is ``engine_run.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from dualpath.runtime.cluster.config import EngineArgs
from dualpath.runtime.cluster.engine_beat import Beat

if TYPE_CHECKING:
    from dualpath.runtime.cluster.engine_setup import Loaded

__all__ = ["EngineArgs", "main", "run_engine", "standby"]


def run_engine(args: EngineArgs, loaded: Loaded | None = None) -> None:
    """Run until the scheduler sends Shutdown (an engine the scheduler forgot registers again).
    ``loaded``: the model as ``load_model(args)`` returns it, loaded already (a standby)."""
    import zmq

    from dualpath.runtime.transfer.auth import load_keys

    keys = load_keys(args.key_file)
    ctx = zmq.Context()
    beat = Beat(ctx, args, keys)  # "loading" from now on, heartbeats once registered
    beat.start()
    try:
        import torch

        torch.set_num_threads(1)
        from dualpath.runtime.cluster.engine_run import run

        run(args, ctx, keys, beat, loaded)
    finally:
        beat.close()
        ctx.term()


def standby(template: EngineArgs, warm_file: str = "") -> None:
    """A warm spare engine process (``LocalCluster`` with standbys): imports and loads the model of
    ``template`` now, touches ``warm_file`` (the supervisor hands out only warm spares), then waits
    for the engine it is to become: one JSON line on stdin, ``[EngineArgs, log path]`` (same model,
    dtype and block size; its output goes to that log from then on), and runs it; an empty line or
    EOF ends it. A restart through a standby skips the process start, the imports and the model
    load."""
    import sys

    import torch

    from dualpath.runtime.cluster.engine_setup import load_model

    torch.set_num_threads(1)
    loaded = load_model(template)
    if warm_file:
        Path(warm_file).touch()
    print(
        f"standby (pid {os.getpid()}): {template.cluster.model} loaded; waiting for an assignment", flush=True
    )
    line = sys.stdin.readline()
    if not line.strip():
        return
    args, log = msgspec.json.decode(line.encode(), type=tuple[EngineArgs, str])
    if log:
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
    a, t = args.cluster, template.cluster
    same = (a.model, a.engine.dtype, a.engine.block_size) == (t.model, t.engine.dtype, t.engine.block_size)
    print(
        f"standby (pid {os.getpid()}): becoming engine {args.engine_id} ({args.role}, generation "
        f"{args.generation})",
        flush=True,
    )
    run_engine(args, loaded if same else None)


def main() -> None:
    """``python -m dualpath.runtime.cluster.engine_main '<EngineArgs as JSON>'``, or
    ``... --standby '<EngineArgs as JSON>' [warm file]`` (see ``standby``)."""
    import sys

    if sys.argv[1] == "--standby":
        standby(msgspec.json.decode(sys.argv[2].encode(), type=EngineArgs), *sys.argv[3:4])
        return
    run_engine(msgspec.json.decode(sys.argv[1].encode(), type=EngineArgs))


if __name__ == "__main__":
    main()
