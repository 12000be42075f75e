"""Span buckets (App. I.1) on the real Qwen3 and SmolLM3 tokenizers."""

import numpy as np
import pytest

from mistill.distill import buckets as bk
from mistill.models.tokenizers import qwen3_tokenizer, smollm3_tokenizer
from mistill.world import prompt as pf


def test_axis_layout(note_prompt, completion, lines):
    axis = bk.build_axis(note_prompt, completion)
    kinds = [b.kind for b in axis.base]
    assert kinds[0] == "header" and kinds.count("line") == len(lines)
    assert kinds.count("note") == 3  # 70 words in windows of 32
    assert kinds.count("instruction") == 1 and kinds[-1] == "trace"
    # tiling: contiguous, covering U exactly
    assert axis.base[0].start == 0 and axis.base[-1].end == len(axis.text)
    assert all(a.end == b.start for a, b in zip(axis.base, axis.base[1:]))
    line = axis.base[axis.line_of_code["N18.9"] - 1]
    assert note_prompt[line.start:line.end].rstrip("\n") == lines[2]
    instr = next(b for b in axis.base if b.kind == "instruction")
    assert note_prompt[instr.start:instr.end].strip().startswith(pf.ROLE_SENTENCE)
    assert axis.n_buckets == 1 + len(axis.base) + 5


def test_sentence_pieces_cap_and_code_dots():
    text = "Consider N18.3 here. " + "x" * 450 + ". Short one! And\nnext"
    pieces = bk.sentence_pieces(text, 0, cap=400)
    assert all(b - a <= 400 for a, b in pieces)
    assert "".join(text[a:b] for a, b in pieces) == text
    assert text[pieces[0][0]:pieces[0][1]] == "Consider N18.3 here."  # no split at the code's dot


@pytest.mark.parametrize("tok_factory", [qwen3_tokenizer, smollm3_tokenizer])
def test_token_buckets_agree_with_character_route(tok_factory, note_prompt, completion):
    tok = tok_factory()
    axis = bk.build_axis(note_prompt, completion)
    prefix = tok.chat_prompt(note_prompt)
    text = prefix + completion
    enc = tok.encode(text)
    tb = bk.token_buckets(axis, text, enc.offsets, prefix)
    assert tb.base_index[0] == bk.SINK
    # template tokens go to the sink; the first prompt token to the header
    prompt_at = prefix.index(note_prompt)
    first_prompt_tok = next(i for i, (s, e) in enumerate(enc.offsets) if s >= prompt_at)
    assert all(tb.base_index[i] == bk.SINK for i in range(first_prompt_tok))
    assert tb.base_index[first_prompt_tok] == 1
    for i, (s, e) in enumerate(enc.offsets[1:], start=1):
        j = s + (len(text[s:e]) - len(text[s:e].lstrip())) if text[s:e].strip() else s
        if prompt_at <= j < prompt_at + len(note_prompt):
            assert tb.base_index[i] == bk.bisect_bucket(axis, j - prompt_at)
        elif j >= len(prefix):
            assert tb.base_index[i] == bk.bisect_bucket(axis, len(note_prompt) + j - len(prefix))
        else:
            assert tb.base_index[i] == bk.SINK


def test_both_tokenizers_pool_onto_one_axis(note_prompt, completion):
    axis = bk.build_axis(note_prompt, completion)
    pooled = []
    for tok in (qwen3_tokenizer(), smollm3_tokenizer()):
        prefix = tok.chat_prompt(note_prompt)
        enc = tok.encode(prefix + completion)
        tb = bk.token_buckets(axis, prefix + completion, enc.offsets, prefix)
        # uniform attention over the tokens of each bucket's characters -> mass per bucket by token count
        pooled.append(bk.pool_rows_numpy(np.ones(len(enc.ids)), tb.base_index, axis.n_buckets))
    # every non-sink base bucket is populated in both models
    assert (pooled[0][1:1 + len(axis.base)] > 0).all() and (pooled[1][1:1 + len(axis.base)] > 0).all()


def test_carving_at_p2c(note_prompt, completion, events, lines):
    axis = bk.build_axis(note_prompt, completion)
    p2c = next(e for e in events if e["kind"] == "P2C")
    ranges = bk.carve_ranges(axis, p2c)
    by_slot = {}
    for s, e, slot in ranges:
        by_slot.setdefault(slot, []).append(axis.text[s:e])
    assert by_slot[axis.slot("own_line")] == [lines[2] + "\n"]
    assert by_slot[axis.slot("sibling_lines")] == [lines[0] + "\n"]  # N17.9 is another category
    assert axis.slot("S") not in by_slot  # N18.9 was not mentioned before this mention
    assert by_slot[axis.slot("N")] == ["N18.3"]  # the earlier mention of the near-miss
    assert by_slot[axis.slot("prefix")] == ["N18."]
    assert bk.carve_ranges(axis, events[0]) == []
    mask = bk.region_mask(axis, p2c, carved=True)
    lines_n = {axis.line_of_code[c] for c in ("N18.3", "N18.9", "N17.9")}
    assert set(np.flatnonzero(mask)) == lines_n | {axis.slot("own_line"), axis.slot("sibling_lines")}


def test_layout_mismatch_is_a_user_error():
    from mistill.errors import UserError
    with pytest.raises(UserError):
        bk.build_axis("free text with no layout", "<think>x</think>")
