"""Typed JSON schemas of the generation request bodies, for the OpenAPI document (``/openapi.json``).

The routes parse raw JSON themselves (``protocol.py`` is the authority and names the field in each
400); these schemas state the same types and ranges (``limits.py``) so OpenAPI tools and fuzzers
(schemathesis and the like) can generate meaningful bodies. Extra fields are allowed, as in OpenAI's API.
Cross-field rules the schema states: ``stream_options`` (not null) only with ``stream: true``. Rules
it cannot state (JSON Schema does not compare two fields or know the served model): ``min_tokens``
0 or equal to ``max_tokens``; prompt plus ``max_tokens`` within the context; token ids below the
vocabulary size (all 400s naming the field).
"""

from __future__ import annotations

from typing import Any

from dualpath.runtime.server import limits

_INT64 = {"type": "integer", "minimum": limits.INT64_MIN, "maximum": limits.INT64_MAX}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_STOP = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "maxItems": limits.MAX_STOP_STRINGS,
        },
        {"type": "null"},
    ]
}

_SAMPLING: dict[str, Any] = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {
        "type": "number",
        "minimum": 0,
        "maximum": limits.MAX_TEMPERATURE,
        "description": f"below {limits.GREEDY_BELOW}: greedy; below {limits.MIN_TEMPERATURE}: raised to it",
    },
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "seed": _INT64,
    "stop": _STOP,
    "stop_token_ids": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0},
        "maxItems": limits.MAX_STOP_TOKEN_IDS,
    },
    "n": {"type": "integer", "enum": [1]},
    "stream": {"type": "boolean"},
    "stream_options": {
        "oneOf": [
            {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
            {"type": "null"},
        ],
        "description": "only with stream=true (null: as if absent)",
    },
    "ignore_eos": {"type": "boolean"},
    "min_tokens": {"type": "integer", "minimum": 0},
    "return_token_ids": {"type": "boolean"},
}

# stream_options (not null) only with stream=true: the server refuses it otherwise (400).
_STREAM_OPTIONS_NEED_STREAM: dict[str, Any] = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}

COMPLETION_SCHEMA: dict[str, Any] = {
    "type": "object",
    **_STREAM_OPTIONS_NEED_STREAM,
    "required": ["prompt"],
    "properties": {
        **_SAMPLING,
        "prompt": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                _TOKEN_IDS,
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
                {"type": "array", "items": _TOKEN_IDS, "minItems": 1, "maxItems": 1},
            ]
        },
    },
}

_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}},
}
CHAT_SCHEMA: dict[str, Any] = {
    "type": "object",
    **_STREAM_OPTIONS_NEED_STREAM,
    "required": ["messages"],
    "properties": {
        **_SAMPLING,
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                    "content": {
                        "oneOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": _PART}]
                    },
                },
            },
        },
    },
}


def request_body(schema: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` of a route whose JSON body follows ``schema``."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
