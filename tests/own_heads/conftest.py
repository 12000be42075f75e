"""Session fixtures of the own-heads tests: compact remaps of the real Qwen3 and SmolLM3 tokenizers."""

from __future__ import annotations

import pytest
import torch
from own_heads_world import corpus_texts

from mistill.models.tokenizers import CompactTokenizer, build_remap, qwen3_tokenizer, smollm3_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def teacher_tokenizer():
    base = qwen3_tokenizer()
    return CompactTokenizer(base, build_remap(base, corpus_texts(base)))


@pytest.fixture(scope="session")
def smol_tokenizer():
    base = smollm3_tokenizer()
    return CompactTokenizer(base, build_remap(base, corpus_texts(base)))
