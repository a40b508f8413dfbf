"""Issue 13, poison values: each request that used to kill the prefill engine for good (or give a
500) gets a 400 naming the field or a valid answer, and a normal request right after succeeds.
Values the edge lets through, and values sent past it straight to the scheduler, sample a valid
token inside the real engines; a request that fails inside an engine fails alone."""

from __future__ import annotations

import asyncio
import time

import httpx
import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath.runtime.cluster.api import SamplingParams
from dualpath.runtime.cluster.client import ClusterClient
from dualpath.runtime.transfer import PrefillDone
from dualpath.runtime.transfer.zmq_wire import CtlMsg

# (label, extra body fields or raw JSON body, status) -- before this change: 503 (engine killed)
# for the first three, then 503 for every later request; 500 for the last three.
POISON = [
    ("temperature=1e-39", {"temperature": 1e-39}, 200),  # greedy (below vLLM's 1e-5)
    ("top_p=5e-324", {"temperature": 1.0, "top_p": 5e-324}, 200),  # keeps the top token
    ("seed=2e13", {"temperature": 1.0, "seed": 20_000_000_000_000}, 200),
    ("seed=2**70", {"temperature": 1.0, "seed": 2**70}, 400),
    ("stop_token_ids=[2**70]", {"stop_token_ids": [2**70]}, 400),
    (
        "lone surrogate",
        '{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud800"}]}',
        400,
    ),
]


@pytest.mark.parametrize(("label", "extra", "status"), POISON, ids=[p[0] for p in POISON])
def test_poison_request_then_a_normal_one(rig, label: str, extra: object, status: int) -> None:
    if isinstance(extra, str):
        r = httpx.post(
            rig.url + "/v1/chat/completions",
            content=extra,
            headers={"content-type": "application/json"},
            timeout=120,
        )
    else:
        r = rig.chat(**extra)  # type: ignore[arg-type]
    assert r.status_code == status, (label, r.text)
    if status == 400:
        assert r.json()["error"]["param"] in ("seed", "stop_token_ids", "messages[0].content")
    else:
        assert len(r.json()["choices"][0]["message"]["content"]) >= 1
    rig.assert_serving()


def _generate(
    address: str,
    params: SamplingParams,
    keys: object,
    rid: str | None = None,
    prompt: list[int] | None = None,
) -> list:
    async def main() -> list:
        async with ClusterClient(address, keys=keys) as client:
            return [ev async for ev in client.generate(prompt or list(range(3, 40)), params, request_id=rid)]

    return asyncio.run(asyncio.wait_for(main(), 120))


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=1e-39, max_tokens=3),
        dict(temperature=5e-324, max_tokens=3),
        dict(temperature=1.0, top_p=5e-324, max_tokens=3),
        dict(temperature=1.0, seed=2**63 - 1, max_tokens=3),
        dict(temperature=1.0, seed=-(2**63), max_tokens=3),
        dict(temperature=1e30, top_p=1e-300, seed=20_000_000_000_000, max_tokens=3),
    ],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items() if k != "max_tokens"),
)
def test_values_past_the_edge_sample_valid_tokens_in_the_engines(rig, params: dict) -> None:
    """Straight to the scheduler (no HTTP validation): the engines' own sampling is safe."""
    events = _generate(rig.cluster.address, SamplingParams(ignore_eos=True, **params), rig.cluster.keys)
    assert [ev.index for ev in events] == [0, 1, 2] and events[-1].finish_reason == "length"
    assert all(0 <= ev.token_id < 512 for ev in events)
    rig.assert_serving()


def test_values_the_wire_cannot_carry_are_refused_by_the_scheduler(rig) -> None:
    """A forged Submit with a NaN temperature is dropped at decode (counted), nothing else."""
    before = rig.metric("dualpath_messages_dropped_total", plane="control", cause="invalid")
    raw = msgspec.msgpack.encode(
        {
            "t": "Submit",
            "request_id": "nan-forger",
            "prompt_token_ids": [5, 6],
            "params": {"temperature": float("nan"), "max_tokens": 2},
        }
    )
    s = rig.sock(zmq.DEALER, rig.cluster.address)  # an insider: it holds the cluster key
    s.send_multipart([b"", raw])
    assert (
        rig.wait_metric("dualpath_messages_dropped_total", before, plane="control", cause="invalid")
        == before + 1
    )
    s.close(0)
    rig.assert_serving()


def test_a_request_failing_inside_an_engine_fails_alone(rig) -> None:
    """A forged ``PrefillDone`` (first token 10**9, out of the vocabulary) waits at the DE for its
    request; when that request arrives the DE fails it alone: an error event to its client, its
    buffers released, and the next requests (one concurrent) are served by the same engines."""
    before = rig.metric("dualpath_engine_request_failures_total")
    push = rig.sock(zmq.PUSH, rig.data_addr("decode"))  # an insider with the key
    head = msgspec.msgpack.encode(
        CtlMsg(1, "tcp://127.0.0.1:1", "e1", "e0", [PrefillDone(key="victim", first_token=10**9)])
    )
    push.send(head)
    time.sleep(0.5)  # (it is held as an orphan until its task comes)
    push.close(0)

    async def both() -> tuple[list, list]:
        async with ClusterClient(rig.cluster.address, keys=rig.cluster.keys) as client:

            async def run(rid: str) -> list:
                return [
                    ev
                    async for ev in client.generate(
                        list(range(3, 40)), SamplingParams(max_tokens=3, ignore_eos=True), request_id=rid
                    )
                ]

            victim, other = await asyncio.gather(run("victim"), run("bystander"))
            return victim, other

    victim, other = asyncio.run(asyncio.wait_for(both(), 120))
    assert victim[-1].finish_reason == "error" and "could not start decoding" in (victim[-1].error or "")
    assert [ev.finish_reason for ev in other] == [None, None, "length"]
    assert rig.wait_metric("dualpath_engine_request_failures_total", before) == before + 1
    rig.assert_serving()


_leaf = (
    st.none()
    | st.booleans()
    | st.sampled_from([1e-39, 5e-324, 2e13, 2**63, 2**70, -(2**70), 1e308])
    | st.integers(-(2**72), 2**72)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
_FIELDS = [
    "temperature",
    "top_p",
    "seed",
    "max_tokens",
    "min_tokens",
    "stop",
    "stop_token_ids",
    "n",
    "stream",
    "ignore_eos",
    "top_k",
    "messages",
    "model",
    "logprobs",
    "presence_penalty",
]


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(fields=st.dictionaries(st.sampled_from(_FIELDS), _leaf | st.lists(_leaf, max_size=3), max_size=5))
def test_random_bodies_never_get_a_5xx_from_the_real_server(rig, fields: dict) -> None:
    """The real HTTP server over the real cluster: no body makes a 5xx (or kills an engine)."""
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], **fields}
    r = httpx.post(rig.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code < 500, (body, r.text)


def test_after_the_fuzzing_every_engine_still_serves(rig) -> None:
    rig.assert_serving()
