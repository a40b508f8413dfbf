"""The API through the official openai client, against the in-process fake cluster."""

from __future__ import annotations

import dualpath_test_fake_cluster as fake_cluster  # loaded by conftest.py
import httpx
import openai
import pytest

from dualpath.runtime.server import CharTokenizer

TOK = CharTokenizer()


def _client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_completion_text_prompt_non_streaming(served) -> None:
    out = _client(served.url).completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0)
    prompt = TOK.encode("hello")
    expected = fake_cluster.expected_tokens(prompt, 5)
    assert out.choices[0].text == TOK.decode(expected)
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (5, 5)
    assert out.usage.total_tokens == 10
    assert served.fake.submitted[0][0] == prompt
    assert served.fake.submitted[0][1].temperature == 0.0


def test_chat_streaming_matches_non_streaming(served) -> None:
    client = _client(served.url)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, seed=7)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content != ""
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.completion_tokens == 12 == full.usage.completion_tokens
    prompt = TOK.chat_ids(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    )
    assert full.usage.prompt_tokens == len(prompt)
    assert served.fake.submitted[0][1].seed == 7


def test_completion_stream_token_ids_and_forced_length(served) -> None:
    client = _client(served.url)
    served.fake.eos_at = 2  # would stop at token 2 unless the length is forced
    prompt = [5, 6, 7, 8]
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=6,
            stream=True,
            extra_body={"min_tokens": 6, "return_token_ids": True},
        )
    )
    ids = [t for c in chunks for t in (c.choices[0].model_extra or {}).get("token_ids", [])]
    assert ids == fake_cluster.expected_tokens(prompt, 6)
    assert served.fake.submitted[-1][1].ignore_eos is True
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=6)
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens == 3


def test_stop_string_cuts_text_and_aborts(served) -> None:
    prompt = "abc"
    ids = fake_cluster.expected_tokens(TOK.encode(prompt), 20)
    text = TOK.decode(ids)
    stop = text[5:7]
    out = _client(served.url).completions.create(model="tiny", prompt=prompt, max_tokens=20, stop=[stop])
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == text[: text.find(stop)]
    assert len(served.fake.aborted) == 1
    (rid,) = served.fake.aborted  # the cluster counts it finished, not cancelled
    assert served.fake.end_reasons == {rid: "stop"}


def test_models_health_metrics(served) -> None:
    models = _client(served.url).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].model_extra["max_model_len"] == 512
    r = httpx.get(served.url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    served.fake.engine_down = True
    r = httpx.get(served.url + "/health")
    assert r.status_code == 503 and r.json()["down"] == ["engine1 (decode)"]
    _client(served.url).completions.create(model="tiny", prompt="x", max_tokens=4)
    text = httpx.get(served.url + "/metrics").text
    assert "dualpath_ttft_seconds_count 1.0" in text
    assert "dualpath_tpot_seconds_count 1.0" in text
    assert 'dualpath_kv_bytes_total{path="de-read"} 8192.0' in text
    assert 'dualpath_nic_bytes_total{nic="node0/snic"} 12288.0' in text
    assert 'dualpath_queue_depth{queue="waiting"} 3.0' in text
    assert "dualpath_store_hit_tokens_total 128.0" in text
    assert 'dualpath_requests_by_read_side_total{side="de"} 1.0' in text
    assert "dualpath_cluster_up 1.0" in text
    assert 'dualpath_engines_alive{role="decode"} 1.0' in text  # engine1 is down (above)
    assert "dualpath_engine_deaths_total 1.0" in text and "dualpath_engine_revivals_total 0.0" in text


def test_cluster_down_gives_503_and_metrics_still_render(served) -> None:
    served.fake.unavailable = True
    assert httpx.get(served.url + "/health").status_code == 503
    with pytest.raises(openai.InternalServerError) as exc:
        _client(served.url).completions.create(model="tiny", prompt="x", max_tokens=2)
    assert exc.value.status_code == 503
    r = httpx.get(served.url + "/metrics")
    assert r.status_code == 200 and "dualpath_cluster_up 0.0" in r.text


def test_concurrent_streams_and_prompt_forms(make_served) -> None:
    import asyncio

    srv = make_served(token_delay_s=0.005)

    async def main() -> list[list[int]]:
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)

        async def one(i: int) -> list[int]:
            prompt = [[3 + i, 4, 5]] if i % 2 else [3 + i, 4, 5]  # [[ids]] and [ids] both work
            stream = await client.completions.create(
                model="tiny", prompt=prompt, max_tokens=10, stream=True, extra_body={"return_token_ids": True}
            )
            return [t async for c in stream for t in c.choices[0].model_extra.get("token_ids", [])]

        return await asyncio.gather(*(one(i) for i in range(24)))

    results = asyncio.run(main())
    for i, ids in enumerate(results):
        assert ids == fake_cluster.expected_tokens([3 + i, 4, 5], 10)
    deep = "[" * 100_000 + "]" * 100_000
    r = httpx.post(srv.url + "/v1/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400
