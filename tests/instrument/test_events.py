"""Event extraction on hand-made traces with the real Qwen3 tokenizer (App. C "Event extraction")."""

from __future__ import annotations

from mistill.instrument.events import extract_events, find_mentions

CODES = ["N18.3", "N18.4", "N18.9", "E11.9", "E11.65", "I10", "J44.1"]
PROSE = " ".join(["the patient was seen for follow up and the plan was discussed at length"] * 4)
COMPLETION = (
    "<think>\n" + PROSE + ".\n"
    "N18.4 chronic kidney disease stage 4 is ruled out, rejected.\n"
    "N18.3 chronic kidney disease stage 3 is documented, accepted. Again N18.3 and N18.3 fit.\n"
    "Then I10 hypertension, accepted. " + PROSE + ".\n</think>\n\n[\"N18.3\", \"I10\"]"
)


def _extract(tokenizer, completion=COMPLETION, **kw):
    chat = tokenizer.chat_prompt("code this note")
    text = chat + completion
    enc = tokenizer.encode(text)
    events, report = extract_events(note_id="n1", text=text, ids=enc.ids, offsets=enc.offsets,
                                    completion_start=len(chat), codes=CODES, tokenizer=tokenizer, **kw)
    return text, enc, events, report


def _tok(tokenizer, s):
    enc = tokenizer.encode(s)
    assert len(enc.ids) == 1
    return enc.ids[0]


def test_mentions_are_inventory_codes_at_code_boundaries():
    text = "N18.3, N18.34 and xN18.9 or (I10) Z99.89 E11.65."
    mentions, unknown = find_mentions(text, CODES)
    assert [(m.code, m.start) for m in mentions] == [("N18.3", 0), ("I10", 29), ("E11.65", 41)]
    assert unknown == ["N18.34", "Z99.89"]


def test_p1_p2_p2c_events_of_a_hand_made_trace(tokenizer):
    text, enc, events, report = _extract(tokenizer)
    completion_start = len(text) - len(COMPLETION)
    by_kind = {k: [e for e in events if e.kind == k] for k in ("P1", "P2", "P2C", "NULL")}
    # P1: first mentions of N18.4, N18.3, I10 -- the letter, bare variant (newline is its own token)
    assert [(e.code, text[enc.offsets[e.pos][0]:enc.offsets[e.pos][1]]) for e in by_kind["P1"]] == [
        ("N18.4", "N"), ("N18.3", "N"), ("I10", " I")]
    p1_i10 = by_kind["P1"][2]
    assert sorted(p1_i10.competitor_ids) == sorted(_tok(tokenizer, " " + L) for L in "EJN")
    assert COMPLETION[p1_i10.anchor] == "I"  # first non-blank character the decision emits
    # P2: only characters with a competitor continuing the prefix to another code
    assert [(e.code, e.prefix, sorted(e.competitor_ids)) for e in by_kind["P2"]] == [
        ("N18.4", "N18.", sorted([_tok(tokenizer, "3"), _tok(tokenizer, "9")])),
        ("N18.3", "N18.", sorted([_tok(tokenizer, "4"), _tok(tokenizer, "9")])),
    ]  # "1", "8" of N18.x and both characters of I10 continue to no other code: skipped
    assert report.skipped_p2_no_competitor == 6
    # P2C: N18.3 after its sibling N18.4, capped at two (first mention, first repeat)
    p2c = by_kind["P2C"]
    assert len(p2c) == 2 and report.p2c_uncapped == 4
    assert all(e.code == "N18.3" and e.near_miss == "N18.4" for e in p2c)
    assert all(e.target_id == _tok(tokenizer, "3") and e.competitor_ids == [_tok(tokenizer, "4")] for e in p2c)
    assert p2c[0].s_pos == [] and len(p2c[1].s_pos) == 1 and len(p2c[0].n_pos) == 1
    s_start, s_end = p2c[1].s_pos[0]
    assert text[enc.offsets[s_start][0]:enc.offsets[s_end - 1][1]] == "N18.3"
    assert text[enc.offsets[p2c[0].pos][0]] == "3" and text[enc.offsets[p2c[0].pos - 1][0]] == "."
    # every event's decided token is where `pos` says, and anchors are completion offsets
    for e in events:
        if e.kind != "NULL":
            assert enc.ids[e.pos] == e.target_id
            assert text[completion_start + e.anchor] == text[enc.offsets[e.pos][0]:enc.offsets[e.pos][1]].strip()[0]


def test_null_events_are_seeded_prose_far_from_code_tokens(tokenizer):
    text, enc, events, report = _extract(tokenizer)
    nulls = [e for e in events if e.kind == "NULL"]
    assert len(nulls) == 20
    think_end = text.index("</think>")
    spaced = {_tok(tokenizer, " " + L) for L in "EIJN"}
    mention_tokens = {i for e in events if e.kind == "P1" for i in range(e.pos, e.pos + 5)}
    for e in nulls:
        assert enc.offsets[e.pos][1] <= think_end
        assert min(abs(e.pos - t) for t in mention_tokens) >= 8
        assert e.target_id in spaced and len(e.competitor_ids) == 3 and e.target_id not in e.competitor_ids
    again = [e for e in _extract(tokenizer)[2] if e.kind == "NULL"]
    assert [(e.pos, e.target_id) for e in again] == [(e.pos, e.target_id) for e in nulls]
    other_seed = [e for e in _extract(tokenizer, seed=1)[2] if e.kind == "NULL"]
    assert [e.pos for e in other_seed] != [e.pos for e in nulls]


def test_unknown_codes_are_reported(tokenizer):
    _, _, _, report = _extract(tokenizer, COMPLETION.replace("Then I10", "Then Z99.89"))
    assert report.unknown_mentions == ["Z99.89"]
