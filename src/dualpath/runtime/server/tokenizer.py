"""Tokenizers for the HTTP layer: a Protocol, a transformers adapter, a tiny character tokenizer,
and an incremental detokenizer for streaming.

The cluster sees token ids only; text <-> ids happens here. ``CharTokenizer`` is the deterministic
tokenizer of the tiny random test model (vocab 256, ids 0/1/2 = pad/bos/eos): tests know exactly
which ids a text becomes.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import Any, Protocol


class Tokenizer(Protocol):
    """What the server needs from a tokenizer."""

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Prompt ids of a chat (template applied, assistant turn opened)."""
        ...


class CharTokenizer:
    """One token per character of a fixed alphabet; ids below ``first_id`` are special.

    Characters outside the alphabet become ``?``. The chat template is
    ``<role>: content\\n`` per message followed by ``assistant: ``.
    """

    def __init__(self, vocab_size: int = 256, first_id: int = 3, eos_token_id: int | None = 2) -> None:
        alphabet = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
        alphabet += [chr(c) for c in range(0xA1, 0x180)]  # Latin-1 / Latin Extended-A letters
        self._chars = alphabet[: max(0, vocab_size - first_id)]
        self._ids = {ch: first_id + i for i, ch in enumerate(self._chars)}
        self._first_id = first_id
        self._eos = eos_token_id

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    def encode(self, text: str) -> list[int]:
        unknown = self._ids["?"]
        return [self._ids.get(ch, unknown) for ch in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        out = []
        for tid in token_ids:
            k = int(tid) - self._first_id
            if 0 <= k < len(self._chars):
                out.append(self._chars[k])
        return "".join(out)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return self.encode(text)


class SpecialTokenInContent(ValueError):
    """A message's content holds a special-token string and the chat template does not keep the
    content intact, so it cannot be encoded as text (``index``: the message)."""

    def __init__(self, index: int, token: str) -> None:
        self.index, self.token = index, token
        super().__init__(
            f"contains the special token {token!r}, and this model's chat template does not keep "
            "message content intact, so it cannot be sent as text"
        )


class HFTokenizer:
    """Adapter over a transformers tokenizer (its own chat template).

    Chat content is text (``chat_ids``): a special-token string in a message (``<|im_end|>``,
    ``<|im_start|>``, any added token marked special) is encoded as the characters it spells,
    never as the control token, so a user cannot close their turn and open a system one. Only the
    template's own markup yields control tokens. (transformers' ``apply_chat_template`` and vLLM's
    chat endpoint parse them in content; a completion's prompt string is the client's whole prompt
    and keeps them: ``encode``.)
    """

    def __init__(self, tok: Any) -> None:
        self._tok = tok
        self._specials = sorted(
            {str(t.content) for t in getattr(tok, "added_tokens_decoder", {}).values() if t.special}
            | set(getattr(tok, "all_special_tokens", [])),
            key=len,
            reverse=True,
        )

    @property
    def eos_token_id(self) -> int | None:
        eos = self._tok.eos_token_id
        return int(eos) if eos is not None else None

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=True))

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The template's ids; content holding a special-token string is encoded as text (see
        the class docstring and ``_content_as_text``)."""
        held = {i: m["content"] for i, m in enumerate(messages) if self._special_in(m["content"])}
        if held:
            return self._content_as_text(messages, held)
        out = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "input_ids"):  # transformers 5: BatchEncoding
            out = out["input_ids"]
        return [int(t) for t in out]  # (the common case: exactly transformers' ids)

    def _content_as_text(self, messages: list[dict[str, str]], held: dict[int, str]) -> list[int]:
        """Render the template with a private placeholder for each held content, tokenize the
        markup around them as the template's (special tokens parsed) and each content with
        special tokens split. ``SpecialTokenInContent`` if the template does not keep each
        placeholder exactly once (it rewrote or dropped the content)."""
        nonce = secrets.token_hex(8)
        pattern = re.compile(f"\ue000{nonce}:(\\d+)\ue001")
        shown = [
            {**m, "content": f"\ue000{nonce}:{i}\ue001"} if i in held else m for i, m in enumerate(messages)
        ]
        text = str(self._tok.apply_chat_template(shown, add_generation_prompt=True, tokenize=False))
        found = [int(m.group(1)) for m in pattern.finditer(text)]
        if sorted(found) != sorted(held):
            i = min(set(held) - set(found) or held)
            raise SpecialTokenInContent(i, next(t for t in self._specials if t in held[i]))
        ids, pos = [], 0
        for m in pattern.finditer(text):
            ids += self._tok.encode(text[pos : m.start()], add_special_tokens=False)
            ids += self._tok.encode(
                held[int(m.group(1))], add_special_tokens=False, split_special_tokens=True
            )
            pos = m.end()
        return [int(t) for t in ids + self._tok.encode(text[pos:], add_special_tokens=False)]

    def _special_in(self, text: str) -> bool:
        return any(t in text for t in self._specials)


def load_tokenizer(model: str, vocab_size: int = 256) -> Tokenizer:
    """``"tiny"`` -> CharTokenizer; anything else -> the model's transformers tokenizer."""
    if model == "tiny":
        return CharTokenizer(vocab_size=vocab_size)
    from dualpath.runtime.model.loader import load_tokenizer as load_hf

    return HFTokenizer(load_hf(model))


class IncrementalDetokenizer:
    """Turns a growing id list into text deltas without re-decoding everything.

    Decodes a short window ``ids[prefix:]`` and emits what extends the window's earlier text; a
    trailing U+FFFD (a multi-byte character cut in half) is held back until the next token.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_tail: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._ids: list[int] = list(prompt_tail[-4:])  # context so the first token decodes right
        self._prefix = 0
        self._read = len(self._ids)
        self.text = ""

    def add(self, token_id: int) -> str:
        """Append one id; return the new text (maybe "")."""
        self._ids.append(token_id)
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a request: whatever text is still held back (e.g. a cut character)."""
        after = self._tok.decode(self._ids[self._prefix :])
        before = self._tok.decode(self._ids[self._prefix : self._read])
        delta = after[len(before) :] if len(after) > len(before) else ""
        self._prefix = self._read = len(self._ids)
        self.text += delta
        return delta
