"""Hugging Face ids of the models in the model table, accepted wherever a model name is.

``resolve_model_name`` maps ``Qwen/Qwen3-32B`` (any case, with or without a local path in front,
as AIConfigurator's ``model_path`` column carries it) to the table's name ``qwen3-32b``.
"""

from __future__ import annotations

HF_ALIASES: dict[str, str] = {
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3-0324": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1": "deepseek-r1",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-r1",
    "deepseek-ai/DeepSeek-V3.2-Exp": "deepseek-v3.2",
    "deepseek-ai/DeepSeek-V4-Pro": "deepseek-v4-pro",
    "deepseek-ai/DeepSeek-V4-Flash": "deepseek-v4-flash",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-32B-FP8": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b-fp8",
    "Qwen/Qwen2.5-32B": "qwen2.5-32b",
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.1-405B": "llama-3.1-405b",
    "meta-llama/Llama-4-Scout-17B-16E": "llama-4-scout",
    "meta-llama/Llama-4-Maverick-17B-128E": "llama-4-maverick",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "zai-org/GLM-4.6": "glm-4.6",
    "HuggingFaceTB/SmolLM2-135M": "smollm2-135m",
}
_BY_LOWER = {k.lower(): v for k, v in HF_ALIASES.items()}
_BY_TAIL = {k.split("/")[-1].lower(): v for k, v in HF_ALIASES.items()}


def resolve_model_name(name: str) -> str:
    """The table name for ``name``: itself, its HF id, or the last two / one path parts of it
    (``/models/Qwen/Qwen3-32B``); unknown names come back unchanged for the lookup to reject."""
    key = name.strip().rstrip("/")
    lower = key.lower()
    if lower in _BY_LOWER:
        return _BY_LOWER[lower]
    parts = lower.split("/")
    if len(parts) >= 2 and "/".join(parts[-2:]) in _BY_LOWER:
        return _BY_LOWER["/".join(parts[-2:])]
    return _BY_TAIL.get(parts[-1], key)
