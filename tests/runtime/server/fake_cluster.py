"""An in-process stand-in with the ClusterClient methods, for HTTP-layer tests (no processes).

Token i of a request is ``3 + (sum(prompt) + 7 * i) % (vocab_size - 3)``, so tests can predict
every answer. Knobs: ``queue_full`` / ``unavailable`` refuse before any token, ``fail_after``
fails a request after that many tokens, ``eos_at`` emits EOS (id 2) at that index unless
``ignore_eos``, ``token_delay_s`` slows tokens. ``aborted`` lists requests closed early.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from dualpath.runtime.cluster.api import (
    ClusterHealth,
    ClusterInfo,
    ClusterUnavailableError,
    ContextTooLongError,
    EngineHealth,
    MetricsSnapshot,
    QueueFullError,
    RequestStats,
    SamplingParams,
    TokenEvent,
)

EOS = 2


def expected_tokens(prompt: list[int], n: int, vocab_size: int = 256) -> list[int]:
    return [3 + (sum(prompt) + 7 * i) % (vocab_size - 3) for i in range(n)]


class FakeCluster:
    def __init__(
        self,
        *,
        vocab_size: int = 256,
        max_context_len: int = 512,
        model_name: str = "tiny",
        token_delay_s: float = 0.0,
    ) -> None:
        self.vocab_size = vocab_size
        self.max_context_len = max_context_len
        self.model_name = model_name
        self.token_delay_s = token_delay_s
        self.queue_full = False
        self.unavailable = False
        self.engine_down = False
        self.fail_after: int | None = None
        self.eos_at: int | None = None
        self.aborted: list[str] = []
        self.end_reasons: dict[str, str] = {}  # request id -> reason given by ``end``
        self.submitted: list[tuple[list[int], SamplingParams]] = []
        self.connected = False
        self.num_finished = 0

    async def connect(self) -> FakeCluster:
        self.connected = True
        return self

    async def close(self) -> None:
        self.connected = False

    async def info(self) -> ClusterInfo:
        if self.unavailable:
            raise ClusterUnavailableError("no scheduler at fake://")
        return ClusterInfo(
            model_name=self.model_name,
            max_context_len=self.max_context_len,
            vocab_size=self.vocab_size,
            eos_token_id=EOS,
            max_queued_requests=4,
            block_size=64,
        )

    async def health(self) -> ClusterHealth:
        if self.unavailable:
            raise ClusterUnavailableError("no scheduler at fake://")
        engines = (
            EngineHealth(
                engine_id=0, role="prefill", node_id=0, alive=True, num_seqs=0, num_tokens=0, last_seen_s=0.0
            ),
            EngineHealth(
                engine_id=1,
                role="decode",
                node_id=1,
                alive=not self.engine_down,
                num_seqs=0,
                num_tokens=0,
                last_seen_s=0.0,
            ),
        )
        return ClusterHealth(
            ok=not self.engine_down,
            engines=engines,
            num_waiting=0,
            num_running=0,
            policy="dualpath",
            down=("engine1 (decode)",) if self.engine_down else (),
        )

    async def metrics(self) -> MetricsSnapshot:
        if self.unavailable:
            raise ClusterUnavailableError("no scheduler at fake://")
        return MetricsSnapshot(
            num_requests=len(self.submitted),
            num_finished=self.num_finished,
            num_failed=0,
            hit_tokens=128,
            prompt_tokens=1000,
            generated_tokens=50,
            bytes_by_path={"pe-read": 4096, "de-read": 8192},
            bytes_by_nic={"node0/snic": 12288},
            queue_depths={"waiting": 3},
            ttft_s=[],
            ttst_s=[],
            tpot_s=[],
            e2e_s=[],
            engines_alive={"prefill": 1, "decode": 1 if self.engine_down else 2},
            engine_deaths=1 if self.engine_down else 0,
        )

    def end(self, request_id: str, reason: str) -> None:
        self.end_reasons[request_id] = reason

    async def generate(
        self, prompt: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[TokenEvent]:
        rid = request_id or uuid.uuid4().hex
        if self.unavailable:
            raise ClusterUnavailableError("no live decode engine")
        if self.queue_full:
            raise QueueFullError("256 requests waiting")
        if len(prompt) + params.max_tokens > self.max_context_len:
            raise ContextTooLongError(f"{len(prompt)} + {params.max_tokens} > {self.max_context_len}")
        self.submitted.append((list(prompt), params))
        tokens = expected_tokens(prompt, params.max_tokens, self.vocab_size)
        done = False
        try:
            for i, tok in enumerate(tokens):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                if self.fail_after is not None and i == self.fail_after:
                    done = True
                    yield TokenEvent(
                        request_id=rid,
                        index=i,
                        token_id=-1,
                        finish_reason="error",
                        error="decode engine 1 died",
                    )
                    return
                eos = self.eos_at == i and not params.ignore_eos
                last = eos or i == len(tokens) - 1
                stats = (
                    RequestStats(
                        prompt_len=len(prompt),
                        hit_len=64,
                        num_generated=i + 1,
                        read_side="de",
                        prefill_engine=0,
                        decode_engine=1,
                        queue_s=0.0,
                        ttft_s=0.01,
                        ttst_s=0.02,
                        e2e_s=0.1,
                    )
                    if last
                    else None
                )
                done = last
                yield TokenEvent(
                    request_id=rid,
                    index=i,
                    token_id=EOS if eos else tok,
                    finish_reason=("stop" if eos else "length") if last else None,
                    stats=stats,
                )
                if last:
                    self.num_finished += 1
                    return
        finally:
            if not done:
                self.aborted.append(rid)
