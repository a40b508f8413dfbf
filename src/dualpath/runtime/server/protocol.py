"""Parse and validate OpenAI request bodies into one ``ApiRequest`` (no I/O).

Every refusal is an ``APIError`` (400/404) naming the field and quoting the value. Extensions for
agent replay (vLLM-style extra body fields): ``ignore_eos``, ``min_tokens`` (0 or == max_tokens,
which forces the length), ``stop_token_ids``, ``return_token_ids`` (token ids in each choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dualpath.core.errors import ConfigError
from dualpath.runtime.cluster.api import ClusterInfo, SamplingParams
from dualpath.runtime.server import limits
from dualpath.runtime.server.errors import APIError, bad_param
from dualpath.runtime.server.tokenizer import SpecialTokenInContent, Tokenizer

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# field -> value that means "not used"; anything else is refused as unsupported
_UNSUPPORTED = {
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "functions": (None, []),
    # vLLM-style extras: accepted only at their "off" value (not implemented)
    "top_k": (None, -1, 0),
    "min_p": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiRequest:
    """A validated request: ``kind`` "chat" or "completion"; ``stop`` are text stop strings."""

    kind: str
    model: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    return_token_ids: bool


def _int(body: dict[str, Any], key: str, default: int | None, lo: int) -> int | None:
    val = body.get(key)
    if val is None:
        return default
    if isinstance(val, bool) or not isinstance(val, int):
        raise bad_param(key, val, "must be an integer")
    if val < lo:
        raise bad_param(key, val, f"must be >= {lo}")
    return val


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    val = body.get(key)
    if val is None:
        return default
    if not isinstance(val, bool):
        raise bad_param(key, val, "must be true or false")
    return val


def _check_model(body: dict[str, Any], served: str) -> str:
    model = body.get("model", served)
    if not isinstance(model, str):
        raise bad_param("model", model, "must be a string")
    if model != served:
        raise APIError(
            404,
            f"model {model!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )
    return model


def _check_unsupported(body: dict[str, Any]) -> None:
    for key, unused in _UNSUPPORTED.items():
        if key in body and body[key] not in unused:
            raise bad_param(key, body[key], "not supported by this server")
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise bad_param("n", n, "only n=1 is supported")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad_param("response_format", fmt, "only {'type': 'text'} is supported")


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise bad_param("stop", stop, "must be a non-empty string or a list of them")
    if len(items) > limits.MAX_STOP_STRINGS:
        raise bad_param("stop", stop, f"at most {limits.MAX_STOP_STRINGS} stop strings")
    return tuple(items)


def _stream_opts(body: dict[str, Any], stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise bad_param("stream_options", opts, "must be an object")
    if not stream:
        raise bad_param("stream_options", opts, "only allowed with stream=true")
    return _bool(opts, "include_usage", False)


def _token_ids(value: Any, info: ClusterInfo) -> list[int] | None:
    """A prompt given as token ids (list of ints, or a one-element list of such a list)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    if not (isinstance(value, list) and value and all(isinstance(t, int) for t in value)):
        return None
    for t in value:
        if isinstance(t, bool) or not 0 <= t < info.vocab_size:
            raise bad_param("prompt", t, f"token id out of range [0, {info.vocab_size})")
    return list(value)


def _completion_prompt(body: dict[str, Any], info: ClusterInfo, tok: Tokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tok.encode(prompt)
    ids = _token_ids(prompt, info)
    if ids is None:
        shown = prompt if not isinstance(prompt, list) else f"list of {len(prompt)} items"
        raise bad_param(
            "prompt",
            shown,
            "must be a string, a list of token ids, or a one-element "
            "list of either (batches are not supported)",
        )
    return ids


def _content(msg: dict[str, Any], i: int) -> str:
    content = msg.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise bad_param(f"messages[{i}].content", part, "only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_param(f"messages[{i}].content", content, "must be a string or a list of text parts")


def _chat_prompt(body: dict[str, Any], tok: Tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_param("messages", messages, "must be a non-empty list of messages")
    clean = []
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in _ROLES:
            raise bad_param(f"messages[{i}].role", role, f"must be one of {', '.join(_ROLES)}")
        clean.append({"role": _ROLES[role], "content": _content(msg, i)})
    try:
        return tok.chat_ids(clean)  # content is text: special-token strings in it stay text
    except SpecialTokenInContent as err:
        raise bad_param(f"messages[{err.index}].content", err.token, str(err)) from None


def _sampling(body: dict[str, Any], max_tokens: int, info: ClusterInfo) -> SamplingParams:
    min_tokens = _int(body, "min_tokens", 0, 0)
    ignore_eos = _bool(body, "ignore_eos", False)
    assert min_tokens is not None
    if min_tokens > max_tokens:
        raise bad_param("min_tokens", min_tokens, f"must be <= max_tokens ({max_tokens})")
    if min_tokens == max_tokens:
        ignore_eos = True  # forced length (agent replay)
    elif min_tokens > 0:
        raise bad_param(
            "min_tokens",
            min_tokens,
            "only 0 or == max_tokens (forced length) is supported; use ignore_eos=true to force generation",
        )
    stop_ids = limits.token_id_list(body, "stop_token_ids", info.vocab_size)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=limits.temperature(body),
            top_p=limits.finite_float(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            seed=limits.int64(body, "seed"),
            stop_token_ids=stop_ids,
            ignore_eos=ignore_eos,
        )
    except ConfigError as exc:
        raise bad_param(exc.key, exc.value, exc.reason) from None


def parse_request(
    kind: str, body: Any, info: ClusterInfo, tok: Tokenizer, served: str, default_max_tokens: int
) -> ApiRequest:
    """Validate ``body`` of a chat ("chat") or text ("completion") request against the cluster."""
    if not isinstance(body, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(body).__name__}")
    limits.check_utf8(body)
    model = _check_model(body, served)
    _check_unsupported(body)
    stream = _bool(body, "stream", False)
    include_usage = _stream_opts(body, stream)
    prompt = _chat_prompt(body, tok) if kind == "chat" else _completion_prompt(body, info, tok)
    limit = info.max_context_len
    room = limit - len(prompt)
    key = "max_completion_tokens" if kind == "chat" and "max_completion_tokens" in body else "max_tokens"
    default = 16 if kind == "completion" else min(default_max_tokens, max(room, 1))
    max_tokens = _int(body, key, default, 1)
    assert max_tokens is not None
    if not prompt:
        raise bad_param("prompt", "", "must not be empty")
    if len(prompt) + max_tokens > limit:
        raise APIError(
            400,
            f"this model's maximum context length is {limit} tokens; the request "
            f"has {len(prompt)} prompt tokens + {key}={max_tokens} = "
            f"{len(prompt) + max_tokens}",
            param=key,
            code="context_length_exceeded",
        )
    return ApiRequest(
        kind=kind,
        model=model,
        prompt_ids=prompt,
        params=_sampling(body, max_tokens, info),
        stream=stream,
        include_usage=include_usage,
        stop=_stop(body),
        return_token_ids=_bool(body, "return_token_ids", False),
    )
