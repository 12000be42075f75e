"""The real tokenizers: how they write codes, offsets, chat templates, and the compact remap."""

from __future__ import annotations

import json

import pytest

from mistill.errors import UserError
from mistill.models.tokenizers import (
    SMOLLM3_SPECIAL_TOKENS,
    UNK_ID,
    CompactTokenizer,
    build_remap,
    qwen3_tokenizer,
    smollm3_tokenizer,
)


def pieces(tokenizer, text):
    enc = tokenizer.encode(text)
    return [text[a:b] for a, b in enc.offsets], enc


def test_qwen3_writes_a_code_as_letter_then_one_token_per_character():
    # Sec. 2.2 / App. I: ` N18.9` -> ` N`, `1`, `8`, `.`, `9`
    tok = qwen3_tokenizer()
    spans, enc = pieces(tok, " N18.9")
    assert spans == [" N", "1", "8", ".", "9"]
    assert [tok.decode([i]) for i in enc.ids] == spans


def test_smollm3_merges_digit_runs():
    # App. J.1: SmolLM3's (Llama-3.2's) BPE writes `18` as one token
    tok = smollm3_tokenizer()
    spans, _ = pieces(tok, " N18.9")
    assert spans == [" N", "18", ".", "9"]
    spans, _ = pieces(tok, '["E11.65"]')
    assert "11" in spans and "65" in spans


@pytest.mark.parametrize("factory", [qwen3_tokenizer, smollm3_tokenizer])
def test_offsets_cover_the_text_and_decode_round_trips(factory):
    tok = factory()
    text = "<think>\nthe findings point to chapter N.\nN18.4 chronic kidney disease stage 4</think>\n\n[\"N18.3\"]"
    enc = tok.encode(text)
    assert len(enc.ids) == len(enc.offsets)
    # offsets tile the text: each token starts where the previous one ended
    assert enc.offsets[0][0] == 0 and enc.offsets[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(enc.offsets, enc.offsets[1:]))
    assert tok.decode(enc.ids) == text
    # the reasoning tags are single special tokens
    assert tok.token_to_id("<think>") in enc.ids and tok.token_to_id("</think>") in enc.ids


def test_qwen3_chat_prompt_is_one_user_turn_with_thinking_on():
    tok = qwen3_tokenizer()
    assert tok.chat_prompt("code this") == "<|im_start|>user\ncode this<|im_end|>\n<|im_start|>assistant\n"
    # thinking off inserts an empty reasoning block, as Qwen3's template does
    assert tok.chat_prompt("x", thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.decode([tok.eos_token_id]) == "<|im_end|>"


def test_smollm3_chat_prompt_defaults_to_think_mode():
    tok = smollm3_tokenizer()
    prompt = tok.chat_prompt("code this")
    assert prompt.startswith("<|im_start|>system\n## Metadata\n")
    assert "Reasoning Mode: /think\n" in prompt
    assert prompt.endswith("<|im_start|>user\ncode this<|im_end|>\n<|im_start|>assistant\n")
    assert "Reasoning Mode: /no_think" in tok.chat_prompt("x", thinking=False)
    # the renamed reserved ids are single tokens with SmolLM3's ids
    for token_id, token in SMOLLM3_SPECIAL_TOKENS.items():
        assert tok.encode(token).ids == [token_id]
    assert tok.eos_token_id == 128012


def test_compact_tokenizer_keeps_real_tokens_and_offsets(tmp_path):
    base = qwen3_tokenizer()
    corpus = ["N18.3 chronic kidney disease stage 3", "<think>\nrejected</think>\n\n[\"N18.3\"]"]
    table = build_remap(base, corpus)
    tok = CompactTokenizer(base, table)
    text = corpus[0]
    real, compact = base.encode(text), tok.encode(text)
    assert compact.offsets == real.offsets
    assert tok.to_base(compact.ids) == real.ids
    assert UNK_ID not in compact.ids and max(compact.ids) < tok.vocab_size
    assert tok.decode(compact.ids) == text
    # a word outside the table maps to the unknown id and decodes visibly
    unseen = tok.encode(" zygomycosis")
    assert UNK_ID in unseen.ids and "\ufffd" in tok.decode(unseen.ids)
    # every letter and digit exists in both spacing variants (P1 competitors)
    for ch in "AZ09":
        assert tok.token_to_id(ch) is not None and tok.encode(" " + ch).ids[0] != UNK_ID
    tok.save(tmp_path)
    again = CompactTokenizer.load(tmp_path)
    assert again.table == tok.table and again.encode(text) == compact


def test_compact_tokenizer_load_errors(tmp_path):
    with pytest.raises(UserError, match="no tokenizer remap"):
        CompactTokenizer.load(tmp_path)
    (tmp_path / "tokenizer_remap.json").write_text(json.dumps({"family": "qwen3"}))
    with pytest.raises(UserError, match="malformed"):
        CompactTokenizer.load(tmp_path)
    (tmp_path / "tokenizer_remap.json").write_text(json.dumps({"family": "gpt2", "table": [1]}))
    with pytest.raises(UserError, match="unknown tokenizer family"):
        CompactTokenizer.load(tmp_path)
