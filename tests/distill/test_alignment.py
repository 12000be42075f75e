"""Events across tokenizers: realised on Qwen3 at every character, dropped inside SmolLM3 digit runs."""

from mistill.distill import alignment as al
from mistill.models.tokenizers import qwen3_tokenizer, smollm3_tokenizer


def _realize(tok, prompt, completion, events):
    prefix = tok.chat_prompt(prompt)
    text = prefix + completion
    enc = tok.encode(text)
    return al.realize_events(events, [e["competitors"] for e in events], ids=enc.ids, offsets=enc.offsets,
                             text=text, completion_at=len(prefix), competitor_map=al.CompetitorMap(tok)), enc, text


def test_qwen_realizes_every_event(note_prompt, completion, events):
    realized, enc, text = _realize(qwen3_tokenizer(), note_prompt, completion, events)
    assert len(realized) == len(events)
    for ev in realized:
        teacher = events[ev.index]
        s, e = enc.offsets[ev.row + 1]
        assert text[s:e].strip()[0] == completion[teacher["anchor"]]
        assert enc.offsets[ev.row][1] <= len(text) - len(completion) + teacher["anchor"]
    p1 = next(ev for ev in realized if ev.kind == "P1")
    assert len(p1.competitor_ids) == 24 and p1.target_id not in p1.competitor_ids


def test_smollm3_drops_merged_digit_runs_never_shifts(note_prompt, completion, events):
    realized, _, _ = _realize(smollm3_tokenizer(), note_prompt, completion, events)
    kinds = [events[ev.index]["kind"] for ev in realized]
    assert kinds.count("P1") == 2
    # "18" is one token: the decision at "1" is realised (its token begins there), at "8" dropped
    kept_p2 = sorted(len(events[ev.index]["prefix"]) for ev in realized if ev.kind == "P2")
    assert kept_p2 == [1, 1, 4, 4]
    cov = al.coverage({"n": [e["kind"] for e in events]}, {"n": realized})
    assert cov["P1"]["share"] == 1.0 and cov["P2"]["share"] == 4 / 6 and cov["P2C"]["share"] == 1.0


def test_decision_row_rule():
    text = "ab cd"
    offsets = [(0, 2), (2, 5)]  # "ab", " cd"
    assert al.decision_row(offsets, text, 3) == 0  # " cd" begins at the anchor up to a space
    assert al.decision_row(offsets, text, 4) is None  # inside " cd": dropped, never shifted
    assert al.window_rows(10, 8) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert al.window_rows(3, 8) == [1, 2]
