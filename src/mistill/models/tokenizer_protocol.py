"""The tokenizer interface every pass uses, whatever backs it.

Backed by the real tokenizer files (Qwen3's, Llama-3.2's for SmolLM3), either
through transformers' AutoTokenizer (paper profile) or through a compact id
remap for the tiny demo models.  Offsets are character spans into the text that
was encoded, so events carry character anchors that any tokenizer can realise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Encoding:
    ids: list[int]
    offsets: list[tuple[int, int]]  # (start, end) character span of each token


class TextTokenizer(Protocol):
    name: str
    vocab_size: int
    eos_token_id: int
    pad_token_id: int

    def encode(self, text: str) -> Encoding:
        """Tokenize `text` as-is (no special tokens added), with character offsets."""

    def decode(self, ids: list[int]) -> str: ...

    def chat_prompt(self, user_text: str, *, thinking: bool = True) -> str:
        """One user turn through the model's chat template, ending where the assistant starts."""
