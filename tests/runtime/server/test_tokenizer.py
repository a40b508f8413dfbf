"""Tokenizers and the incremental detokenizer."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dualpath.runtime.server.tokenizer import CharTokenizer, IncrementalDetokenizer


class ByteTokenizer:
    """One token per UTF-8 byte: multi-byte characters span several tokens."""

    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(ids).decode(errors="replace")

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode("".join(m["content"] for m in messages))


def test_char_tokenizer_roundtrip_and_specials() -> None:
    tok = CharTokenizer(vocab_size=512)
    text = "Hello, wörld!\n\ttabs"
    ids = tok.encode(text)
    assert len(ids) == len(text) and min(ids) >= 3 and max(ids) < 512
    assert tok.decode(ids) == text
    assert tok.decode([0, 1, 2] + ids[:1]) == "H"  # special ids decode to nothing
    assert tok.decode(tok.encode("€")) == "?"  # outside the alphabet


def test_small_vocab_keeps_ids_in_range() -> None:
    tok = CharTokenizer(vocab_size=40)
    assert max(tok.encode("xyz ~~")) < 40


@pytest.mark.parametrize("text", ["plain ascii", "naïve café ☕ 日本語", "🙂🙂 emoji"])
def test_incremental_detokenizer_never_emits_half_characters(text: str) -> None:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok, prompt_tail=tok.encode("prompt "))
    deltas = [detok.add(t) for t in tok.encode(text)]
    deltas.append(detok.flush())
    assert "".join(deltas) == text == detok.text
    assert all("\ufffd" not in d for d in deltas)


def test_flush_emits_a_trailing_cut_character() -> None:
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok)
    assert detok.add(0xE2) == ""  # first byte of a 3-byte character
    assert detok.flush() == "\ufffd"


@pytest.mark.slow
def test_smollm2_chat_template() -> None:
    from dualpath.runtime.server.tokenizer import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    ids = tok.chat_ids([{"role": "user", "content": "hi"}])
    text = tok.decode(ids)
    assert "hi" in text and tok.eos_token_id == 2
    assert tok.decode(tok.encode("hello world")) == "hello world"
