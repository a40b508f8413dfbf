"""Context windows of the paper's eight models, to flag plans whose requests exceed them.

``max_position_embeddings`` of each model's published config.json (the Hugging Face repository
named in ``spec.model_table``), except the two DeepSeek-V4 models, whose config.json is not in the
shared data: their 1M-token window is DeepSeek's published context length (1,000,000 tokens, the
default context capacity of DeepSeek's own V4 client). Qwen3-235B-A22B's config gives 40,960
(32,768 native; YaRN extends it to 131,072, not applied here). The planner still plans a request
that exceeds its model's window (the paper's I/O 1000 asks for 1M-token prompts); the plan says so.
"""

from __future__ import annotations

from typing import Final

CONTEXT_WINDOWS: Final[dict[str, int]] = {
    "deepseek-v4-pro": 1_000_000,
    "deepseek-v4-flash": 1_000_000,
    "llama-3.1-405b": 131_072,
    "llama-4-maverick": 1_048_576,
    "llama-4-scout": 10_485_760,
    "glm-4.6": 202_752,
    "gpt-oss-120b": 131_072,
    "qwen3-235b-a22b": 40_960,
}


def context_report(model_name: str, contexts: list[int]) -> dict[str, object]:
    """The plan's ``context`` object: the model's window (None when unknown), the longest and mean
    final context (input + output), and how many requests exceed the window."""
    window = CONTEXT_WINDOWS.get(model_name)
    over = 0 if window is None else sum(1 for c in contexts if c > window)
    return {
        "window_tokens": window,
        "max_context_len": max(contexts),
        "mean_context_len": sum(contexts) / len(contexts),
        "exceeds_window": over > 0,
        "share_over_window": over / len(contexts),
    }
