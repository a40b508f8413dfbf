"""OpenAI response objects (plain dicts) and SSE framing for chat and text completions."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from dualpath.runtime.server.protocol import ApiRequest


class ResponseBuilder:
    """Builds the answer objects of one request (one id and creation time for all its chunks)."""

    def __init__(self, req: ApiRequest) -> None:
        self.req = req
        chat = req.kind == "chat"
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"

    def usage(self, num_generated: int) -> dict[str, int]:
        prompt = len(self.req.prompt_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": num_generated,
            "total_tokens": prompt + num_generated,
        }

    def _choice(
        self, text: str, token_ids: list[int] | None, finish: str | None, delta: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.req.kind == "chat":
            if delta is not None:
                choice["delta"] = delta
            else:
                choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if self.req.return_token_ids and token_ids is not None:
            choice["token_ids"] = token_ids
        return choice

    def full(self, text: str, token_ids: list[int], finish: str) -> dict[str, Any]:
        """The non-streaming answer."""
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.req.model,
            "choices": [self._choice(text, token_ids, finish)],
            "usage": self.usage(len(token_ids)),
        }

    def chunk(
        self, text: str, token_ids: list[int], finish: str | None, role: bool = False
    ) -> dict[str, Any]:
        """One streamed chunk (chat: ``delta``; ``role`` opens the assistant message)."""
        delta: dict[str, Any] | None = None
        if self.req.kind == "chat":
            delta = (
                {"role": "assistant", "content": text}
                if role
                else ({"content": text} if text or finish is None else {})
            )
        return {
            "id": self.id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.req.model,
            "choices": [self._choice(text, token_ids, finish, delta)],
        }

    def usage_chunk(self, num_generated: int) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.req.model,
            "choices": [],
            "usage": self.usage(num_generated),
        }


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"
