"""Own-heads per-note reuse is keyed by the note's inputs: a changed trace or changed teacher events
recompute exactly the notes that read them (the note itself, and for knock-in the note it donates to)."""

from __future__ import annotations

import json

import pytest
from own_heads_world import tiny_qwen3, write_world

from mistill.evaluate.own_heads import run_chain
from mistill.io import read_jsonl, write_jsonl


@pytest.fixture(scope="module")
def arm(tmp_path_factory, teacher_tokenizer):
    root = tmp_path_factory.mktemp("own_heads_keys")
    params = write_world(root, teacher_tokenizer)
    params["instrument"]["knockin"]["min_range"] = 1e-3
    model = tiny_qwen3(teacher_tokenizer.vocab_size, seed=3)

    def run():
        run_chain("unused", "qwen", 0, params, model=model, tokenizer=teacher_tokenizer,
                  teacher_tokenizer=teacher_tokenizer)

    run()
    return root, run


def stamps(root) -> dict[str, int]:
    """The per-note files of the arm's readouts (M6) and trace edits (M6-edits), by path under `root`."""
    files = [p for kind in ("M6", "M6-edits") for p in sorted((root / kind / "qwen-s0").glob("*/*.jsonl"))]
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in files}


def rewritten(before: dict[str, int], after: dict[str, int]) -> list[str]:
    assert set(after) == set(before)
    return sorted(k for k in before if after[k] != before[k])


def test_unchanged_inputs_recompute_nothing(arm):
    root, run = arm
    before = stamps(root)
    run()
    assert rewritten(before, stamps(root)) == []


def test_a_changed_trace_recomputes_that_note_and_the_note_it_donates_to(arm):
    root, run = arm
    before = stamps(root)
    path = root / "TR-008" / "traces.jsonl"
    rows = read_jsonl(path)
    assert "patient note 2 with" in rows[2]["prompt"]
    # the note text lies in the prompt: the teacher's events (anchored in the completion) still hold
    rows[2]["prompt"] = rows[2]["prompt"].replace("patient note 2 with", "patient note 2 and")
    write_jsonl(path, rows)
    run()
    # note2: realised events, knock-in, read side, edits; note1: knock-in, whose donor is note2 (App. K)
    assert rewritten(before, stamps(root)) == ["M6-edits/qwen-s0/note2/events.jsonl",
                                               "M6-edits/qwen-s0/note2/prefix_edit.jsonl",
                                               "M6/qwen-s0/note1/patch2.jsonl", "M6/qwen-s0/note2/events.jsonl",
                                               "M6/qwen-s0/note2/patch2.jsonl", "M6/qwen-s0/note2/readside.jsonl"]
    meta = json.loads((root / "M6" / "qwen-s0" / "note1" / "patch2.jsonl.meta.json").read_text())
    assert meta["donor"] == "note2" and len(meta["inputs_sha256"]) == 64


def test_changed_teacher_events_recompute_the_notes_that_read_them(arm):
    root, run = arm
    before = stamps(root)
    path = root / "TR-008" / "events" / "note0" / "events.jsonl"
    events = read_jsonl(path)
    last_p2 = max(i for i, e in enumerate(events) if e["kind"] == "P2")
    write_jsonl(path, events[:last_p2] + events[last_p2 + 1:])
    run()
    # note0's realised events lose the event; note3's knock-in reads them too: its donor is note0 (wrap)
    assert rewritten(before, stamps(root)) == ["M6-edits/qwen-s0/note0/events.jsonl",
                                               "M6-edits/qwen-s0/note0/prefix_edit.jsonl",
                                               "M6/qwen-s0/note0/events.jsonl", "M6/qwen-s0/note0/patch2.jsonl",
                                               "M6/qwen-s0/note0/readside.jsonl", "M6/qwen-s0/note3/patch2.jsonl"]
