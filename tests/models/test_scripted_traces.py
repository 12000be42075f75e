"""Scripted coding traces: structure, near-miss ordering, answer, determinism."""

from __future__ import annotations

import json

from mistill.models.scripted_traces import script_trace
from mistill.models.traces import code_mentions, mention_counts
from mistill.world.types import Code, Note

CANDIDATES = [
    Code("N18.3", "chronic kidney disease stage 3 moderate"),
    Code("E11.9", "type 2 diabetes mellitus without complications"),
    Code("N18.4", "chronic kidney disease stage 4 severe"),
    Code("I10", "essential primary hypertension"),
    Code("E11.65", "type 2 diabetes mellitus with hyperglycemia"),
    Code("N18.5", "chronic kidney disease stage 5"),
]
NOTE = Note("n1", "p1",
            "history of type 2 diabetes mellitus without complications hospital course no evidence of "
            "chronic kidney disease stage 4 severe treated for chronic kidney disease stage 3 moderate",
            ("N18.3", "E11.9", "Z99.9"))


def test_trace_shape_and_answer():
    trace = script_trace(NOTE, CANDIDATES)
    text = trace.completion
    assert text.startswith("<think>\n") and text.count("</think>") == 1
    reasoning, answer = text.split("</think>")
    assert answer.startswith("\n\n") and json.loads(answer) == ["E11.9", "N18.3"]
    # the gold code outside the candidate lines is never named
    assert "Z99.9" not in text and trace.answer == ("E11.9", "N18.3")
    # findings follow the note: diabetes is documented before kidney disease
    assert reasoning.index("chapter E") < reasoning.index("chapter N")


def test_near_miss_is_named_before_the_chosen_code():
    trace = script_trace(NOTE, CANDIDATES)
    text = trace.completion
    decisions = {d.code: d.near_miss for d in trace.decisions}
    # the sibling the note rules out is the one rejected
    assert decisions["N18.3"] == "N18.4"
    assert "N18.4 chronic kidney disease stage 4 severe is ruled out in the summary, rejected." in text
    assert text.index("N18.4") < text.index("N18.3")
    # E11.9 has a sibling in the list that the note does not mention: a seeded draw rejects it
    assert decisions["E11.9"] == "E11.65" and "E11.65" in text and "not documented, rejected" in text
    # so both chosen codes are first mentioned after a sibling (P2C candidates), and the first
    # differing character against the near-miss is the last one: N18.[3] vs N18.[4]
    counts = mention_counts(text, [c.code for c in CANDIDATES])
    assert counts.first_after_sibling == 2
    first_n183 = next(pos for pos, code in code_mentions(text, ["N18.3"]))
    assert text[first_n183:first_n183 + 5] == "N18.3"


def test_deterministic_by_note_and_seed():
    a = script_trace(NOTE, CANDIDATES, seed=0)
    assert a == script_trace(NOTE, CANDIDATES, seed=0)
    many = {script_trace(Note(f"n{i}", "p", "nothing relevant", ("E11.9",)), CANDIDATES, seed=0).decisions[0].near_miss
            for i in range(20)}
    assert many == {"E11.65"}  # the only sibling: every draw picks it


def test_no_supported_code():
    trace = script_trace(Note("n2", "p2", "well patient", ("Z99.9",)), CANDIDATES)
    assert trace.answer == () and trace.completion.endswith("</think>\n\n[]")


def test_traces_without_near_misses_name_no_sibling_and_keep_every_other_line():
    """The students' pretraining without the teacher's contrastive step: no rejected sibling, so no
    code is first written after a sibling (no P2C candidate); every other line is the full trace's."""
    full = script_trace(NOTE, CANDIDATES)
    plain = script_trace(NOTE, CANDIDATES, near_misses=False)
    assert "rejected" not in plain.completion and "N18.4" not in plain.completion
    assert plain.answer == full.answer
    assert [d.near_miss for d in plain.decisions] == [None, None]
    assert plain.completion.splitlines() == [line for line in full.completion.splitlines()
                                             if not line.endswith("rejected.")]
    assert mention_counts(plain.completion, [c.code for c in CANDIDATES]).first_after_sibling == 0
