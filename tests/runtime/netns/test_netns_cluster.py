"""A cluster across network namespaces (conftest.py): the scheduler on host 0, a prefill engine on
host 1 and a decode engine on host 2, each joined with ``dualpath engine --scheduler HOST:PORT
--restart-on-exit``, CURVE on, the tiny random model (seed 0), the links capped by tc tbf. A
request is served end to end on each read path (forced by the policy, as the local cluster tests
do), its tokens those of a single-process forward, the per-path byte counters exactly its hit KV,
on the right node; an engine without the key is refused; kill -9 of a remote engine and of the
scheduler, and the cluster serves again."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from dualpath.runtime.cluster.api import ClusterHealth, MetricsSnapshot, SamplingParams
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.transfer.auth import load_keys

from .conftest import CNIC_MBIT, Hosts, run, wait_for

pytestmark = pytest.mark.slow

PE_HOST, DE_HOST = 1, 2
TRANSPORTS = ("zmq", "mooncake", "nixl")  # (shm is one host's: no namespace can cross it)
PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def _client(h: Hosts) -> ClusterClient:
    return ClusterClient(h.address, keys=load_keys(str(h.key_file)), query_timeout_s=10.0)


async def _health(h: Hosts) -> ClusterHealth:
    async with _client(h) as c:
        return await c.health()


async def _metrics(h: Hosts) -> MetricsSnapshot:
    async with _client(h) as c:
        return await c.metrics()


def settled_metrics(h: Hosts) -> MetricsSnapshot:
    """Metrics once the byte counters stopped moving: the engines report theirs with heartbeats
    (every 0.2 s), so one snapshot can lag behind the requests just finished."""
    last: list[MetricsSnapshot] = []

    def same() -> MetricsSnapshot | None:
        m = run(_metrics, h)
        prev = last[-1] if last else None
        last.append(m)
        stable = prev is not None and (prev.bytes_by_path, prev.bytes_by_nic) == (
            m.bytes_by_path,
            m.bytes_by_nic,
        )
        return m if stable else None

    return wait_for("the byte counters to settle", same, 60, 1.0)


def health(h: Hosts) -> ClusterHealth | None:
    try:
        return run(_health, h, timeout_s=20)
    except Exception:  # (no scheduler yet / restarting)
        return None


def serving(h: Hosts) -> ClusterHealth:
    """Wait until a prefill and a decode engine are ready."""

    def ready() -> ClusterHealth | None:
        got = health(h)
        ok = got is not None and {e.role for e in got.engines if e.alive} == {"prefill", "decode"}
        return got if ok else None

    return wait_for("a ready prefill and decode engine", ready, 180)


async def _generate(h: Hosts, prompts: list[list[int]], policy: str | None) -> list[list]:
    async with _client(h) as c:
        if policy is not None:
            await c.configure(policy)
        return [[ev async for ev in c.generate(p, PARAMS)] for p in prompts]


def generate(h: Hosts, prompts: list[list[int]], policy: str | None = None) -> list[list]:
    return run(_generate, h, prompts, policy)


def reference(h: Hosts, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of a single-process full forward of the same checkpoint."""
    import torch

    from dualpath.runtime.model import load_decoder

    torch.set_num_threads(1)
    dec, _ = load_decoder(h.model, device="cpu")
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(n):
            out.append(int(torch.argmax(dec.forward_full(ids)[-1]).item()))
            ids.append(out[-1])
    return out


def kv_bytes_per_token(h: Hosts) -> int:
    from dualpath.runtime.cluster.kvio import Geometry
    from dualpath.runtime.model import load_decoder

    dec, _ = load_decoder(h.model, device="cpu")
    return Geometry.of(dec, 64).layout().kv_bytes_per_token


@pytest.fixture(scope="module", params=TRANSPORTS)
def cluster(hosts: Hosts, request: pytest.FixtureRequest) -> Iterator[Hosts]:
    """One cluster per KV transport that imports here (the others skip, naming what is missing)."""
    from dualpath.runtime.transfer.factory import missing

    why = missing(request.param)
    if why:
        pytest.skip(f"transport {request.param} not importable here: {why}")
    hosts.use(request.param)
    try:
        hosts.start_scheduler("--create-key")
        wait_for("the key file", hosts.key_file.exists, 60, 0.1)
        hosts.start_engine(
            "prefill", PE_HOST, "prefill", "--key-file", str(hosts.key_file), "--restart-on-exit"
        )
        hosts.start_engine(
            "decode", DE_HOST, "decode", "--key-file", str(hosts.key_file), "--restart-on-exit"
        )
        serving(hosts)
        yield hosts
    finally:
        hosts.stop_all()


def test_the_hosts_are_separate_and_the_links_capped_by_tc(cluster: Hosts) -> None:
    h = serving(cluster)
    addrs = {e.role: e.data_addr for e in h.engines}
    assert addrs == {"prefill": f"tcp://{cluster.ip(PE_HOST)}:" + addrs["prefill"].rsplit(":", 1)[1],
                     "decode": f"tcp://{cluster.ip(DE_HOST)}:" + addrs["decode"].rsplit(":", 1)[1]}  # fmt: skip
    if cluster.cnic != "tc":
        pytest.skip(f"tc refused a tbf qdisc here ({cluster.cnic}): the engines emulate the cap")
    for host in (PE_HOST, DE_HOST):
        near = subprocess.run(
            ["tc", "qdisc", "show", "dev", cluster.veth(host)], capture_output=True, text=True
        )
        far = subprocess.run(["ip", "netns", "exec", f"{cluster.name}-{host}", "tc", "qdisc", "show", "dev", "eth0"],
                             capture_output=True, text=True)  # fmt: skip
        for out in (near.stdout, far.stdout):
            assert "tbf" in out and f"rate {CNIC_MBIT}Mbit" in out, out
    # an engine process in its namespace sees only its own link, not the others' addresses
    links = subprocess.run(["ip", "netns", "exec", f"{cluster.name}-{PE_HOST}", "ip", "-o", "addr"],
                           capture_output=True, text=True).stdout  # fmt: skip
    assert cluster.ip(PE_HOST) in links and cluster.ip(DE_HOST) not in links and cluster.ip(0) not in links


@pytest.mark.parametrize("policy,side", [("basic", "pe"), ("always-de", "de")])
def test_a_request_is_served_across_namespaces_on_each_read_path(
    cluster: Hosts, policy: str, side: str
) -> None:
    """Turn 1 fills the store, turn 2 hits it on ``side``: the hit bytes are counted on that path
        only, on that side's node, exactly hit tokens x KV bytes per token; the KV the engines sent each
        other crossed the veths (the kernel counted at least as many bytes leaving each host as its
    engine counted on its compute NIC, encrypted and framed)."""
    ids = {e.role: e.engine_id for e in serving(cluster).engines if e.alive}  # (in registration order)
    rng = random.Random(11 if side == "pe" else 12)
    prompts = [[rng.randrange(3, 512) for _ in range(150 + 70 * i)] for i in range(2)]
    first = generate(cluster, prompts, policy)
    before = settled_metrics(cluster)
    follow = [p + [e.token_id for e in evs] + [rng.randrange(3, 512) for _ in range(40)]
              for p, evs in zip(prompts, first, strict=True)]  # fmt: skip
    second = generate(cluster, follow, None)
    hit = 0
    for prompt, events in zip(follow, second, strict=True):
        assert events[-1].finish_reason == "length", events[-1]
        assert [e.token_id for e in events] == reference(cluster, prompt, PARAMS.max_tokens)
        st = events[-1].stats
        assert st.read_side == side and st.hit_len >= 128, st
        hit += st.hit_len
    want = hit * kv_bytes_per_token(cluster)
    other = "de-read" if side == "pe" else "pe-read"
    node = "node0" if side == "pe" else "node1"  # (the PE's node, the DE's node)

    after = settled_metrics(cluster)
    path = {k: v - before.bytes_by_path.get(k, 0) for k, v in after.bytes_by_path.items()}
    nic = {k: v - before.bytes_by_nic.get(k, 0) for k, v in after.bytes_by_nic.items()}
    assert path[f"{side}-read"] == want > 0 and path[other] == 0, path
    assert nic[f"{node}/snic:read"] == want, nic
    assert path["pd-transfer"] > 0, path
    pe, de = f"engine{ids['prefill']}/cnic", f"engine{ids['decode']}/cnic"
    for host, link in ((PE_HOST, pe), (DE_HOST, de)):  # (bytes since the links were made)
        assert cluster.sent_bytes(host) >= after.bytes_by_nic[link], (host, after.bytes_by_nic)
    assert nic[pe] > 0, nic  # (the prompt's KV, PE -> DE)
    if side == "de":  # the PE pulled the hits layer by layer from the DE over the DE's link
        assert nic[de] >= want, nic


def test_an_engine_without_the_cluster_key_is_refused(cluster: Hosts) -> None:
    """From another namespace: an engine with no key file, and one with another cluster's key,
    never register (the CURVE handshake fails; the scheduler counts each attempt)."""
    from dualpath.runtime.transfer.auth import ClusterKeys

    def refused() -> int:
        m = run(_metrics, cluster)
        return m.messages_dropped.get("control/unauthenticated", 0)

    start = refused()
    other = ClusterKeys.generate().write(cluster.run_dir / "other.key")
    plain = cluster.start_engine("intruder-plain", 3, "decode")
    keyed = cluster.start_engine("intruder-keyed", 3, "decode", "--key-file", str(other))
    try:
        wait_for("refused handshakes", lambda: refused() >= start + 2, 120)
        h = health(cluster)
        assert h is not None and all(e.node_id != 2 for e in h.engines), h.engines  # (host 3: node 2)
        assert plain.poll() is None and keyed.poll() is None  # still knocking, never in
        for label in ("intruder-plain", "intruder-keyed"):
            assert "data plane at" not in cluster.log(label)  # (never got a Welcome)
    finally:
        for proc in (plain, keyed):
            proc.kill()
            proc.wait(30)
    serving(cluster)
    assert generate(cluster, [[5] * 70])[0][-1].finish_reason == "length"


def test_the_engines_data_ports_refuse_a_socket_without_the_key(cluster: Hosts) -> None:
    """zmq transport across namespaces: KV sent to each engine's data port from this (the
    client's) namespace without the key is refused at the handshake; the engine counts it."""
    import msgspec
    import zmq

    from dualpath.runtime.transfer.zmq_wire import DataMsg

    def refused() -> int:
        return run(_metrics, cluster).messages_dropped.get("data/unauthenticated", 0)

    start = refused()
    ctx = zmq.Context()
    try:
        for e in serving(cluster).engines:
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(e.data_addr)
            s.send(msgspec.msgpack.encode(DataMsg(1, "tcp://127.0.0.1:9", "e1", "e0", [])))
            time.sleep(0.3)
            s.close(0)
    finally:
        ctx.term()
    wait_for("refused data-plane handshakes (reported with heartbeats)", lambda: refused() >= start + 2, 30)
    assert generate(cluster, [[6] * 70])[0][-1].finish_reason == "length"


def test_a_killed_remote_engine_is_restarted_by_its_keeper(cluster: Hosts) -> None:
    """kill -9 of the decode engine's process on host 2: its keeper (``--restart-on-exit``)
    starts it again under the same engine id as the next generation; the cluster serves again."""
    old = next(e for e in serving(cluster).engines if e.role == "decode")
    os.kill(old.pid, signal.SIGKILL)

    def back() -> object:
        h = health(cluster)
        return h and any(e.role == "decode" and e.alive and e.pid != old.pid for e in h.engines) and h

    h = wait_for("the decode engine restarted", back, 180)
    new = next(e for e in h.engines if e.role == "decode" and e.alive)
    assert new.engine_id == old.engine_id and new.generation == old.generation + 1
    assert "killed by SIGKILL; restarting in" in cluster.log("decode")
    assert cluster.procs["decode"].poll() is None  # (the keeper itself runs on)
    events = generate(cluster, [[9] * 80])[0]
    assert events[-1].finish_reason == "length" and len(events) == PARAMS.max_tokens


def test_engines_register_again_with_a_restarted_scheduler(cluster: Hosts) -> None:
    """kill -9 of the scheduler on host 0, started again on the same address: both remote
    engines (same processes) register again under their ids and the cluster serves."""
    before = {e.role: (e.engine_id, e.pid) for e in serving(cluster).engines if e.alive}
    proc = cluster.procs["scheduler"]
    proc.send_signal(signal.SIGKILL)  # (``ip netns exec`` execs: this is the scheduler)
    proc.wait(30)
    cluster.start_scheduler()
    h = wait_for(
        "both engines back",
        lambda: (
            (got := health(cluster))
            and {e.role: (e.engine_id, e.pid) for e in got.engines if e.alive} == before
            and got
        ),
        180,
    )
    assert h.ok
    assert generate(cluster, [[13] * 90])[0][-1].finish_reason == "length"
    assert "registering again" in cluster.log("prefill") and "registering again" in cluster.log("decode")
