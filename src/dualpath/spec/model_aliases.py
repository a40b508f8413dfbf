"""Hugging Face ids of the models in the model table, accepted wherever a model name is.

Quantised re-releases (``-FP8``, NVIDIA's ``-FP4``) map to the architecture they quantise; their
precision is a separate input (``dualpath plan latency --precision``), not part of the name.

``resolve_model_name`` maps ``Qwen/Qwen3-32B`` (any case, with or without a local path in front,
as AIConfigurator's ``model_path`` column carries it) to the table's name ``qwen3-32b``.
"""

from __future__ import annotations

HF_ALIASES: dict[str, str] = {
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3-0324": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1": "deepseek-r1",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-r1",
    "nvidia/DeepSeek-R1-FP4": "deepseek-r1",
    "nvidia/DeepSeek-R1-0528-FP4": "deepseek-r1",
    "nvidia/DeepSeek-R1-0528-FP4-v2": "deepseek-r1",
    "nvidia/DeepSeek-V3-0324-FP4": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3.2-Exp": "deepseek-v3.2",
    "deepseek-ai/DeepSeek-V4-Pro": "deepseek-v4-pro",
    "deepseek-ai/DeepSeek-V4-Flash": "deepseek-v4-flash",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-32B-FP8": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b-fp8",
    "Qwen/Qwen2.5-32B": "qwen2.5-32b",
    "Qwen/Qwen3-8B": "qwen3-8b",
    "Qwen/Qwen3-8B-FP8": "qwen3-8b",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Qwen/Qwen3-30B-A3B-FP8": "qwen3-30b-a3b",
    "nvidia/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b-fp8",
    "nvidia/Qwen3-235B-A22B-FP4": "qwen3-235b-a22b",
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.1-70b",  # the Llama-3.1-70B architecture
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
    "nvidia/Llama-3.1-70B-Instruct-FP8": "llama-3.1-70b",
    "nvidia/Llama-3.3-70B-Instruct-FP8": "llama-3.1-70b",
    "nvidia/Llama-3.3-70B-Instruct-FP4": "llama-3.1-70b",
    "meta-llama/Llama-3.1-405B": "llama-3.1-405b",
    "meta-llama/Llama-4-Scout-17B-16E": "llama-4-scout",
    "meta-llama/Llama-4-Maverick-17B-128E": "llama-4-maverick",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "zai-org/GLM-4.6": "glm-4.6",
    "HuggingFaceTB/SmolLM2-135M": "smollm2-135m",
    "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5",
    "MiniMaxAI/MiniMax-M2.1": "minimax-m2.5",  # the same shape (config.json)
    "MiniMaxAI/MiniMax-M2": "minimax-m2.5",
    "nvidia/MiniMax-M2.5-NVFP4": "minimax-m2.5",
    "Qwen/Qwen3.5-397B-A17B": "qwen3.5-397b-a17b",
    "Qwen/Qwen3.5-397B-A17B-FP8": "qwen3.5-397b-a17b",
    "nvidia/Qwen3.5-397B-A17B-NVFP4": "qwen3.5-397b-a17b",
    "moonshotai/Kimi-K2.5": "kimi-k2.5",
    "nvidia/Kimi-K2.5-NVFP4": "kimi-k2.5",
    "moonshotai/Kimi-K2-Instruct": "kimi-k2",
    "moonshotai/Kimi-K2-Instruct-0905": "kimi-k2",
    "zai-org/GLM-5": "glm-5",
    "zai-org/GLM-5-FP8": "glm-5",
    "zhipuai/GLM-5": "glm-5",
    "nvidia/GLM-5-NVFP4": "glm-5",
}
_QUANT_SUFFIXES = ("-fp8-dynamic", "-fp8", "-fp4", "-nvfp4", "-v2", "-awq", "-gptq")
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
    tail = parts[-1]
    while tail not in _BY_TAIL:  # an unlisted quantised re-release: drop its precision suffix
        stripped = next((tail[: -len(s)] for s in _QUANT_SUFFIXES if tail.endswith(s)), None)
        if stripped is None:
            return key
        tail = stripped
    return _BY_TAIL[tail]
