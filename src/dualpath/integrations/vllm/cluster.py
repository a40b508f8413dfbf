"""vLLM P/D on one machine standing in for a storage-bound cluster: ``num_prefill`` prefill instances
(nodes 0..p-1, default one) and ``num_decode`` decode instances (nodes p..p+d-1), a DualPath agent per node (agent.py), the proxy
(proxy.py) with the router (router.py) in this process. No vLLM import: the instances are
``python -m vllm.entrypoints.openai.api_server`` processes of ``vllm_python``.

Every instance runs the connector over one shared store. A prefill instance's connector reads
PE-side hits through its node's emulated storage NIC (``snic_gbps``); a decode node's agent reads
DE-side hits through that node's NIC and forwards them to the prefill instance. Decode instances
load the prompt's KV from the store uncapped: it stands for the prefill -> decode transfer over the
compute network (the KV the prefill just saved), not for a storage read. Every process started is
stopped (its process group) on ``stop``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import dualpath
from dualpath.core.errors import ConfigError, DualpathError
from dualpath.integrations.vllm import CONNECTOR_CLASS, CONNECTOR_MODULE
from dualpath.integrations.vllm.layout import model_layout
from dualpath.integrations.vllm.proxy import Proxy
from dualpath.integrations.vllm.router import Instance, Router
from dualpath.runtime.kvstore import BlockStore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True, kw_only=True)
class PDConfig:
    """``snic_gbps``: each node's storage-NIC cap (None: uncapped); ``load``: the prefill
    connectors' load mode (settings.py); ``block_size``: vLLM's and the store's block;
    ``beta_tokens``: the policy's per-PE prefill batch budget (router.py; with the default a PE's
    fetch takes the whole prefill queue, so further prefill instances get work only while the
    first is busy)."""

    model: str
    root: str
    num_decode: int = 2
    num_prefill: int = 1
    snic_gbps: float | None = 0.2
    load: str = "async"
    block_size: int = 32
    max_model_len: int = 2048
    kv_cache_gib: int = 1
    beta_tokens: int = 1 << 20
    vllm_python: str = sys.executable
    startup_timeout_s: float = 1200.0


@dataclass(slots=True)
class PDCluster:
    """The started processes and the proxy; use as a context manager."""

    config: PDConfig
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    instances: list[Instance] = field(default_factory=list)
    agents: dict[int, str] = field(default_factory=dict)
    proxy: Proxy | None = None
    server: Any = None

    @property
    def root(self) -> Path:
        return Path(self.config.root)

    def _env(self) -> dict[str, str]:
        src = str(Path(dualpath.__file__).resolve().parents[1])
        return dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
                    VLLM_CPU_KVCACHE_SPACE=str(self.config.kv_cache_gib),
                    # one unpinned OpenMP thread per instance (conversation.py says why)
                    VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
                    OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))  # fmt: skip

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / "logs" / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip

    def _connector(self, node: int, role: str) -> dict[str, Any]:
        c, root = self.config, self.root
        extra: dict[str, Any] = {
            "store_dir": str(root / "store"),
            "counters_file": str(root / f"node{node}-{role}.json"),
        }
        if role == "prefill":
            extra["load"] = c.load
            if c.snic_gbps is not None:
                extra.update(snic_gbps=c.snic_gbps, snic_state_file=str(root / f"node{node}.snic"))
        return {"kv_connector": CONNECTOR_CLASS, "kv_connector_module_path": CONNECTOR_MODULE,
                "kv_role": "kv_both", "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}  # fmt: skip

    def start(self, on_progress: Any = None) -> PDCluster:
        c, root = self.config, self.root
        if not (Path(c.model) / "config.json").is_file():
            raise ConfigError(
                "model", c.model, "is not an HF folder (dualpath model export smollm2-135m DIR)"
            )
        (root / "logs").mkdir(parents=True, exist_ok=True)
        layout = model_layout(c.model, c.block_size)
        store = BlockStore(root / "store", layout, "auto")
        if c.num_prefill < 1 or c.num_decode < 1:
            raise ConfigError(
                "num_prefill/num_decode", f"{c.num_prefill}/{c.num_decode}", "need at least one of each"
            )
        nodes = range(c.num_prefill + c.num_decode)
        for node in nodes:
            port = _free_port()
            cmd = [sys.executable, "-m", "dualpath.integrations.vllm.agent", "--model", c.model, "--store-dir",
                   str(root / "store"), "--block-size", str(c.block_size), "--node-id", str(node), "--port",
                   str(port), "--counters", str(root / f"node{node}-*.json")]  # fmt: skip
            if c.snic_gbps is not None:
                cmd += ["--snic-gbps", str(c.snic_gbps), "--snic-state-file", str(root / f"node{node}.snic")]
            self._spawn(f"agent{node}", cmd)
            self.agents[node] = f"http://127.0.0.1:{port}"
        for node in nodes:
            role = "prefill" if node < c.num_prefill else "decode"
            port = _free_port()
            cmd = [c.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", c.model, "--port", str(port),
                   "--dtype", "float32", "--max-model-len", str(c.max_model_len), "--block-size", str(c.block_size),
                   "--enforce-eager", "--no-enable-prefix-caching", "--max-num-seqs", "8",
                   "--kv-transfer-config", json.dumps(self._connector(node, role))]  # fmt: skip
            self._spawn(f"{role}{node}", cmd)
            self.instances.append(Instance(role=role, node_id=node, url=f"http://127.0.0.1:{port}",
                                           agent_url=self.agents[node]))  # fmt: skip
        self._wait_healthy(on_progress)
        from dualpath.integrations.vllm.tokens import load_tokenizer
        from dualpath.runtime.server.run import BackgroundServer

        rate = 1e12 if c.snic_gbps is None else c.snic_gbps * 1e9 / 8
        router = Router(
            self.instances, store, policy="dualpath", read_bytes_per_s=rate, beta_tokens=c.beta_tokens
        )
        self.proxy = Proxy(router, model=c.model, tokenize=load_tokenizer(c.model))
        from dualpath.integrations.vllm.proxy import make_app

        self.server = BackgroundServer(make_app(self.proxy)).start()
        return self

    def _wait_healthy(self, on_progress: Any) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        pending = {**{f"agent{n}": u for n, u in self.agents.items()},
                   **{f"{i.role}{i.node_id}": i.url for i in self.instances}}  # fmt: skip
        while pending:
            for name, url in list(pending.items()):
                proc = self.procs[name]
                if proc.poll() is not None:
                    tail = (self.root / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise DualpathError(f"{name} exited with {proc.returncode} while starting:\n{tail}")
                try:
                    if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                        del pending[name]
                        if on_progress is not None:
                            on_progress(name)
                except httpx.HTTPError:
                    pass
            if time.monotonic() > deadline:
                raise DualpathError(f"not healthy after {self.config.startup_timeout_s} s: {sorted(pending)}")
            time.sleep(2.0)

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.url)

    def metrics(self) -> dict[int, dict[str, float]]:
        """Each node agent's ``/metrics`` counters (``dualpath_vllm_*_total``), by node."""
        out: dict[int, dict[str, float]] = {}
        for node, url in self.agents.items():
            text = httpx.get(f"{url}/metrics", timeout=10.0).text
            out[node] = {
                line.split()[0].removeprefix("dualpath_vllm_").removesuffix("_total"): float(line.split()[1])
                for line in text.splitlines()
                if line.startswith("dualpath_vllm_") and line.split()[0].endswith("_total")
            }
        return out

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        self.procs.clear()

    def __enter__(self) -> PDCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
