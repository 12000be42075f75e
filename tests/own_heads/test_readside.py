"""The read side against brute force: eager attention probabilities and a slow, obvious categoriser."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from own_heads_world import INVENTORY, tiny_qwen3, tiny_smollm3, traces

from mistill.errors import UserError
from mistill.instrument import readside as rs
from mistill.instrument.passes import Trace, model_input
from mistill.world.prompt import LIST_HEADER


def _eager_rows(model, ids, rows):
    """Full attention probabilities [L][H, len(rows), T] from an eager forward."""
    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
    finally:
        model.config._attn_implementation = impl
    return [a[0][:, rows].double().numpy() for a in out.attentions]


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["qwen3", "smollm3"])
def test_captured_rows_equal_eager_attention(family, implementation, teacher_tokenizer, smol_tokenizer):
    tok = teacher_tokenizer if family == "qwen3" else smol_tokenizer
    model = (tiny_qwen3 if family == "qwen3" else tiny_smollm3)(tok.vocab_size, seed=5)
    model.config._attn_implementation = implementation   # the capture keeps the model's own (causal) masking
    trace = Trace(**{k: v for k, v in traces()[0].items()})
    _, ids, _, _ = model_input(tok, trace)
    rows = [10, len(ids) // 2, len(ids) - 2]
    capture = rs.QueryKeyCapture(model, [0, 1], rows)
    with torch.no_grad(), capture.active():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    assert model.config._attn_implementation == implementation  # restored
    eager = _eager_rows(model, ids, rows)
    for layer in (0, 1):  # SmolLM3: layer 1 is a NoPE layer (no_rope_layer_interval=2)
        for r, q in enumerate(rows):
            got = capture.attention_rows(layer, [0, 1, 2, 3], r)
            np.testing.assert_allclose(got, eager[layer][:, r, : q + 1], atol=2e-6)
            np.testing.assert_allclose(eager[layer][:, r, q + 1:], 0.0, atol=1e-7)


def _slow_category(text, offsets, j, prompt, completion_at, code, near_miss, anchor, prefix):
    """The obvious route: string searches per token (no shared code with readside's layout)."""
    s, e = offsets[j]
    c = s + (len(text[s:e]) - len(text[s:e].lstrip())) if text[s:e].strip() else s
    if j < 8:
        return "sink"
    if c >= completion_at:
        rel = c - completion_at
        start = anchor - len(prefix)
        if start <= rel < anchor:
            return "trace_prefix"
        comp = text[completion_at:]
        for m_code, _ in INVENTORY:
            i = comp.find(m_code)
            while i >= 0:
                before = comp[i - 1] if i else " "
                after = comp[i + len(m_code)] if i + len(m_code) < len(comp) else " "
                if not (before.isalnum() or before == ".") and not after.isalnum() and \
                        i <= rel < i + len(m_code) and i < start:
                    return "trace_S" if m_code == code else "trace_N" if m_code == near_miss else "trace_other_codes"
                i = comp.find(m_code, i + 1)
        return "trace_prose"
    p0 = text.find(prompt)
    if not p0 <= c < p0 + len(prompt):
        return "template"
    for line_code, desc in INVENTORY:
        line = f"{line_code} {desc}"
        i = text.find("\n" + line + "\n", p0) + 1
        if i <= c < i + len(line):
            if line_code == code:
                return "own_line"
            if line_code == near_miss:
                return "near_miss_line"
            if line_code[:3] == code[:3]:
                return "category_lines"
            if line_code[0] == code[0]:
                return "chapter_lines"
            return "other_chapter_lines"
    if c < text.find("Discharge summary:", p0):
        return "inventory_other"
    if c < text.rfind("\n\n", p0, p0 + len(prompt)) + 2:  # a blank separator belongs to the section before
        return "note"
    return "instruction"


def test_categories_and_shares_match_brute_force(teacher_tokenizer):
    tok = teacher_tokenizer
    model = tiny_qwen3(tok.vocab_size, seed=6)
    comp = ("<think>\nconsider N18.4 stage 4, then N18.3 stage 3, so E11.65 and N18.4 again.\n</think>\n\n"
            '["N18.4"]')
    trace = Trace("t", traces()[0]["prompt"], comp)  # S: the first N18.4; N: N18.3; N17.9 shares the chapter
    text, ids, offsets, completion_at = model_input(tok, trace)
    mention = comp.index("N18.4 again")
    events = [rs.ReadEvent("P2C", 0, mention + 4, "N18.4", "N18.", "N18.3"),
              rs.ReadEvent("P1", 0, comp.index("E11.65"), "E11.65", "", None),
              rs.ReadEvent("P2", 0, comp.index("E11.65") + 5, "E11.65", "E11.6", None)]
    for ev in events:
        ev.pos = next(j for j, (s, e) in enumerate(offsets) if s <= completion_at + ev.anchor < e)
    layout = rs.note_layout(text, offsets, trace.prompt, completion_at)
    heads = [(0, 0), (0, 3), (1, 1), (1, 2)]
    rows = rs.read_note(model, ids, layout, events, heads)
    eager = _eager_rows(model, ids, [ev.pos - 1 for ev in events])
    seen = set()
    for r, (ev, row) in enumerate(zip(events, rows)):
        q = ev.pos - 1
        slow = [_slow_category(text, offsets, j, trace.prompt, completion_at, ev.code, ev.near_miss, ev.anchor,
                               ev.prefix) for j in range(q + 1)]
        cats = rs.event_categories(layout, code=ev.code, near_miss=ev.near_miss, anchor=ev.anchor,
                                   prefix=ev.prefix, upto=q)
        assert [rs.CATEGORIES[c] for c in cats] == slow
        seen |= set(slow)
        shares = np.array(row["shares"])
        np.testing.assert_allclose(shares.sum(1), 1.0, atol=1e-6)
        for i, (layer, head) in enumerate(heads):
            probs = eager[layer][head, r, : q + 1]
            for name in rs.CATEGORIES:
                brute = probs[[j for j in range(q + 1) if slow[j] == name]].sum()
                assert shares[i, rs.CAT[name]] == pytest.approx(brute, abs=2e-6)
            lines = [j for j in range(q + 1) if slow[j] in rs.LINE_CATEGORIES]
            region = [j for j in range(q + 1) if slow[j] in rs.REGION_CATEGORIES]
            lift = (probs[region].sum() / probs[lines].sum()) / (len(region) / len(lines))
            assert row["lift"][i] == pytest.approx(lift, rel=1e-5)
    # the hand-made trace exercises every category
    assert seen == set(rs.CATEGORIES)


def test_region_lift_by_hand():
    cats = np.array([rs.CAT[c] for c in ("sink", "own_line", "own_line", "other_chapter_lines",
                                          "other_chapter_lines", "other_chapter_lines", "other_chapter_lines",
                                          "trace_prose")])
    probs = np.array([[0.2, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2],     # region 0.2 of lines 0.6, 2 of 6 tokens
                      [0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5]])    # no mass on the lines: undefined
    lift, n_eff = rs.region_lift(probs, cats)
    assert lift[0] == pytest.approx((0.2 / 0.6) / (2 / 6))
    assert n_eff[0] == pytest.approx(6.0)  # uniform over 6 line tokens
    assert np.isnan(lift[1]) and np.isnan(n_eff[1])


def test_panel_aggregation_by_hand():
    rows = [{"kind": "P2C", "heads": [5, 9], "lift": [2.0, 1.0], "shares": [[0] * 15, [0] * 15]},
            {"kind": "P2C", "heads": [5, 9], "lift": [4.0, None], "shares": [[0] * 15, [0] * 15]},
            {"kind": "P2C", "heads": [5, 9], "lift": [9.0, 3.0], "shares": [[0] * 15, [0] * 15]},
            {"kind": "P1", "heads": [5, 9], "lift": [100.0, 100.0], "shares": [[0] * 15, [0] * 15]}]
    rows[0]["shares"][0][rs.CAT["trace_N"]] = 0.3
    rows[1]["shares"][0][rs.CAT["trace_N"]] = 0.1
    values = rs.panel_note_values(rows, "P2C", [5, 9])
    assert values["lift"] == pytest.approx((4.0 + 2.0) / 2)  # per head the median over events, then the mean
    assert values["top_head_share_N"] == pytest.approx(0.4 / 3)
    assert values["share_N"] == pytest.approx((0.4 / 3 + 0.0) / 2)


def test_prompt_without_the_frozen_header_is_a_user_error():
    with pytest.raises(UserError, match="list header"):
        rs.parse_prompt("some other prompt")
    start = len(LIST_HEADER) + 2
    lines, lines_end, note_start, instruction_start = rs.parse_prompt(
        LIST_HEADER + "\n\nA00.1 x\nB01.2 y z\n\nDischarge summary:\n\nnote\n\nDo it.")
    assert lines == [("A00.1", start, start + 7), ("B01.2", start + 8, start + 17)]
    assert lines_end == start + 17 and note_start == start + 19
    assert instruction_start == start + 17 + len("\n\nDischarge summary:\n\nnote\n\n")
