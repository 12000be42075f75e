"""The blinded audit of contrastive events (App. C; R-C9): frame, sheet, label import, generator labels, readout."""

from __future__ import annotations

import csv
import json
from collections import Counter
from dataclasses import dataclass

import pytest
from scipy.stats import binomtest

from mistill.errors import UserError
from mistill.evaluate import audit
from mistill.evaluate.audit import ContrastiveEvent, Stratum
from mistill.world.demo_notes import COURSE_RULED_OUT
from mistill.world.demo_truth import rules_out
from mistill.world.inventory import Inventory
from mistill.world.types import Code, Note

STRATA = Stratum.every()


def _event(i: int, stratum: Stratum, note: str = "n1") -> ContrastiveEvent:
    return ContrastiveEvent(note, i, 100 + i, "N18.3", "N18.4", 10 + i, stratum)


def _population(sizes: list[int]) -> list[ContrastiveEvent]:
    out, i = [], 0
    for stratum, n in zip(STRATA, sizes):
        for _ in range(n):
            out.append(_event(i, stratum, note=f"n{i % 7}"))
            i += 1
    return out


def test_allocation_is_equal_capped_and_spreads_the_rest():
    sizes = dict(zip(STRATA, [50, 3, 0, 20, 1, 9, 40, 2]))
    take = audit.allocate(sizes, 40)
    assert sum(take.values()) == 40
    assert all(take[s] <= sizes[s] for s in sizes)
    # small strata give everything; the large ones split the rest as evenly as possible
    assert [take[s] for s in STRATA if sizes[s] <= 5] == [3, 0, 1, 2]
    big = [take[s] for s in STRATA if sizes[s] > 5]
    assert max(big) - min(big) <= 1
    assert sum(audit.allocate(sizes, 10_000).values()) == sum(sizes.values())   # a frame larger than the population


def test_the_draw_is_seeded_stratified_and_records_its_weights():
    population = _population([30, 4, 0, 12, 2, 0, 9, 1])
    frame = audit.draw_frame(population, 24, seed=3)
    assert frame == audit.draw_frame(population, 24, seed=3)
    assert frame["events"] != audit.draw_frame(population, 24, seed=4)["events"]
    drawn = [ContrastiveEvent.from_json(row) for row in frame["events"]]
    assert len(drawn) == 24 and len({(e.note_id, e.event_index) for e in drawn}) == 24
    assert Counter(e.stratum.name for e in drawn) == {k: v for k, v in frame["sample"].items() if v}
    assert frame["population"] == {s.name: n for s, n in zip(STRATA, [30, 4, 0, 12, 2, 0, 9, 1])}


def test_weighted_share_is_the_horvitz_thompson_estimate():
    population = {"a": 90, "b": 10}
    sample = {"a": 3, "b": 2}
    items = [("a", "rejection"), ("a", "other"), ("a", "other"), ("b", "rejection"), ("b", "rejection")]
    got = audit.weighted_share(items, population, sample, lambda x: x == "rejection")
    # stratum a: 1 of 3 -> 30 events of 90; stratum b: 2 of 2 -> 10 of 10; 40 of 100
    assert got == pytest.approx(40.0)


def _completion() -> str:
    return ("<think>\nthe summary documents ckd; the findings point to chapter N.\n"
            "N18.4 chronic kidney disease stage 4 is ruled out in the summary, rejected.\n"
            "N18.3 chronic kidney disease stage 3 is documented, accepted.\n</think>\n\n[\"N18.3\"]")


def test_the_sheet_is_blinded_and_its_key_maps_every_item(tmp_path):
    completion = _completion()
    anchor = completion.index("N18.3") + 4
    mention = completion.index("N18.4")
    stratum = Stratum(True, True, True)
    events = [ContrastiveEvent("n00001-0", 7, anchor, "N18.3", "N18.4", mention, stratum),
              ContrastiveEvent("n00002-0", 3, anchor, "N18.3", "N18.4", mention, stratum)]
    frame = {"events": [e.to_json() for e in events], "population": {stratum.name: 2}, "sample": {stratum.name: 2}}
    rows, key = audit.sheet_rows(frame, {"n00001-0": completion, "n00002-0": completion}, seed=0, context_lines=2)
    assert [r["item"] for r in rows] == ["A1", "A2"]
    assert {(k["note_id"], k["event_index"]) for k in key.values()} == {("n00001-0", 7), ("n00002-0", 3)}
    audit.write_csv(tmp_path / "sheet.csv", rows, audit.SHEET_COLUMNS)
    text = (tmp_path / "sheet.csv").read_text()
    assert "n0000" not in text and "stratum" not in text and "gold" not in text   # nothing but the trace's lines
    row = rows[0]
    assert row["earlier_mention_context"].endswith("[[N18.4]] chronic kidney disease stage 4 is ruled out in the "
                                                   "summary, rejected.")
    assert row["earlier_mention_context"].startswith("the summary documents ckd")     # the line before it
    assert row["decision_context"].startswith("N18.4 chronic") and "[[N18.3]] chronic kidney disease stage 3" in \
        row["decision_context"]
    assert row["label"] == "" and row["clinically_meaningful"] == ""


def _labels_file(tmp_path, rows):
    path = tmp_path / "labels.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(audit.LABEL_COLUMNS)
        writer.writerows(rows)
    return path


KEY = {"A1": {}, "A2": {}}


def test_label_import_accepts_a_complete_file_in_any_case(tmp_path):
    path = _labels_file(tmp_path, [["A2", "Enumeration", "no"], ["A1", " rejection ", "YES"]])
    assert audit.read_labels(path, KEY) == {"A1": ("rejection", True), "A2": ("enumeration", False)}


@pytest.mark.parametrize("rows, message", [
    ([["A1", "rejection", "yes"], ["A3", "other", "no"]], "A3' is not in the audit key"),
    ([["A1", "rejection", "yes"], ["A1", "other", "no"]], "A1 labelled twice"),
    ([["A1", "rejected", "yes"], ["A2", "other", "no"]], "label 'rejected' of A1"),
    ([["A1", "rejection", "maybe"], ["A2", "other", "no"]], "clinically_meaningful 'maybe' of A1"),
    ([["A1", "rejection", "yes"]], "1 item(s) of the key unlabelled, first A2"),
])
def test_label_import_refuses_with_one_line_naming_the_problem(tmp_path, rows, message):
    path = _labels_file(tmp_path, rows)
    with pytest.raises(UserError) as err:
        audit.read_labels(path, KEY)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(path) in str(err.value)


def test_label_import_names_a_missing_column(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_text("item,label\nA1,rejection\n")
    with pytest.raises(UserError, match="missing column"):
        audit.read_labels(path, KEY)


def test_clinically_meaningful_rule():
    assert audit.clinically_meaningful("chronic kidney disease stage 3", "chronic kidney disease stage 4")
    assert not audit.clinically_meaningful("other acute kidney failure", "acute kidney failure unspecified")
    assert not audit.clinically_meaningful("body mass index 30.0-30.9 adult", "body mass index 31.0-31.9 adult")
    assert not audit.clinically_meaningful("street as the place of occurrence", "farm as the place of occurrence")


INVENTORY = Inventory([Code("N18.3", "chronic kidney disease stage 3"), Code("N18.4", "chronic kidney disease stage 4"),
                       Code("N18.5", "chronic kidney disease stage 5"), Code("E11.9", "type 2 diabetes mellitus")])


@dataclass
class _Trace:
    prompt: str
    completion: str


def test_generator_labels_follow_what_the_note_names():
    ruled_out = COURSE_RULED_OUT[1].format(d="chronic kidney disease stage 4")
    note = Note("n00001-0", "p1", f"course {ruled_out} patient was found to have chronic kidney disease stage 3",
                ("N18.3",))
    assert rules_out(note.text, "chronic kidney disease stage 4")
    assert not rules_out(note.text, "chronic kidney disease stage 5")
    kept = "</think>\n\n[\"N18.3\"]"
    stratum = Stratum(True, True, True)
    rejection = ContrastiveEvent(note.note_id, 0, 50, "N18.3", "N18.4", 10, stratum)
    enumeration = ContrastiveEvent(note.note_id, 1, 50, "N18.3", "N18.5", 10, stratum)
    assert audit.generator_label(rejection, note, kept, INVENTORY) == ("rejection", True)
    assert audit.generator_label(enumeration, note, kept, INVENTORY) == ("enumeration", True)
    # a sibling the note documents as a finding is a candidate for the same condition too
    gold_sibling = Note(note.note_id, "p1", note.text, ("N18.3", "N18.5"))
    assert audit.generator_label(enumeration, gold_sibling, kept, INVENTORY)[0] == "rejection"
    both = "</think>\n\n[\"N18.3\", \"N18.4\"]"
    assert audit.generator_label(rejection, note, both, INVENTORY)[0] == "both_endorsed"
    dropped = "</think>\n\n[\"E11.9\"]"
    assert audit.generator_label(rejection, note, dropped, INVENTORY)[0] == "other"


def test_readout_shares_match_a_hand_count_and_scipy_intervals():
    strata = [Stratum(True, True, True), Stratum(True, True, False)]
    events = [_event(i, strata[i % 2]) for i in range(10)]
    key = {f"A{i}": e.to_json() for i, e in enumerate(events)}
    classes = ["rejection", "enumeration", "rejection", "other", "enumeration",
               "other", "rejection", "other", "both_endorsed", "other"]
    labels = {f"A{i}": (c, i != 3) for i, c in enumerate(classes)}
    frame = {"population": {strata[0].name: 50, strata[1].name: 10}, "sample": {strata[0].name: 5, strata[1].name: 5}}
    got = audit.audit_readout(key, labels, frame)
    assert got["n"] == 10
    for label in audit.LABELS:
        count = classes.count(label)
        entry = got["classes"][label]
        assert entry["count"] == count and entry["percent"] == pytest.approx(10.0 * count)
        ci = binomtest(count, 10).proportion_ci(confidence_level=0.95, method="exact")
        assert (entry["low"], entry["high"]) == pytest.approx((100 * ci.low, 100 * ci.high))
    # even items (the final-answer stratum, weight 10): rejection x3 of 5; odd items (weight 2): none
    assert got["classes"]["rejection"]["weighted_percent"] == pytest.approx(100 * (50 * 3 / 5) / 60)
    assert got["rejection_final_answer"]["count"] == 3 and got["rejection_final_answer"]["n"] == 5
    assert got["rejection_not_final_answer"]["count"] == 0
    assert got["clinically_meaningful"]["count"] == 9


def test_frame_sheet_labels_and_readout_agree_with_the_generators_truth(tmp_path):
    """The whole path on generated events: export the sheet, label with the generator, import, read out; the
    readout's class counts equal a direct recount of the generator's rule over the frame."""
    ruled_out = COURSE_RULED_OUT[0].format(d="chronic kidney disease stage 4")
    notes = {f"n{i:05d}-0": Note(f"n{i:05d}-0", f"p{i}", f"hospital course {ruled_out if i % 3 else ''} ckd",
                                 ("N18.3",)) for i in range(9)}
    completion = _completion()
    anchor = completion.index("N18.3") + 4
    events = []
    for i, note_id in enumerate(notes):
        sibling = "N18.4" if i % 2 else "N18.5"
        events.append(ContrastiveEvent(note_id, 0, anchor, "N18.3", sibling, completion.index("N18.4"),
                                       STRATA[i % 3]))
    frame = audit.draw_frame(events, 6, seed=0)
    traces = {n: _Trace("", completion) for n in notes}
    rows, key = audit.sheet_rows(frame, {n: completion for n in notes}, seed=0, context_lines=1)
    audit.write_csv(tmp_path / "labels.csv", audit.generator_labels(key, notes, traces, INVENTORY),
                    audit.LABEL_COLUMNS)
    labels = audit.read_labels(tmp_path / "labels.csv", key)
    readout = audit.audit_readout(key, labels, frame)
    truth = Counter()
    for row in frame["events"]:
        event = ContrastiveEvent.from_json(row)
        named = rules_out(notes[event.note_id].text, INVENTORY[event.near_miss].description)
        truth["rejection" if named else "enumeration"] += 1
    assert {k: v["count"] for k, v in readout["classes"].items() if v["count"]} == dict(truth)
    assert sum(truth.values()) == 6
    assert json.loads(json.dumps(readout))   # plain JSON all the way down


def _reader():
    from pathlib import Path

    from mistill.repro.reader_module import load_reader

    return load_reader(Path(__file__).resolve().parents[2] / "readers" / "r_c9.py")


def test_table24_reads_match_the_arms_realised_events_by_hand(tmp_path):
    from mistill.io import write_json, write_jsonl

    m6 = tmp_path / "M6" / "student-x-s0"
    write_json(m6 / "faithfulness2.json", {"notes": ["n1"]})
    # the arm realises the audited anchors 100 and 101 (rows 20 and 21) but not 102
    write_jsonl(m6 / "n1" / "events.jsonl", [
        {"kind": "P1", "pos": 5, "anchor": 90}, {"kind": "P2C", "pos": 20, "anchor": 100},
        {"kind": "P2C", "pos": 21, "anchor": 101}, {"kind": "NULL", "pos": 3, "anchor": 2}])
    write_jsonl(m6 / "n1" / "patch2.jsonl", [
        {"kind": "P1", "pos": 5, "margin_clean": -1.0},
        {"kind": "P2C", "pos": 20, "margin_clean": 2.0, "margin_corr": -2.0, "margin_all": 2.0,
         "knockin": {"top": {"4": 1.0}}},                                   # R = (1 + 2) / 4 = 0.75
        {"kind": "P2C", "pos": 21, "margin_clean": -0.5, "margin_corr": -0.1, "margin_all": 0.3,
         "knockin": {"top": {"4": 0.3}}}])                                  # range 0.4 < 1 nat: not patched
    stratum = Stratum(True, True, True)
    audited = {"A1": ContrastiveEvent("n1", 0, 100, "N18.3", "N18.4", 1, stratum),
               "A2": ContrastiveEvent("n1", 1, 101, "N18.3", "N18.4", 1, stratum),
               "A3": ContrastiveEvent("n1", 2, 102, "N18.3", "N18.4", 1, stratum)}
    reader = _reader()
    rows = reader.realised_rows(m6, audited)
    assert sorted(rows) == ["A1", "A2"]
    got = reader.restricted_reads(rows, ["A1", "A2", "A3"], k=4, min_range=1.0)
    assert got == {"m1": 0.5, "m1_events": 2, "knockin": pytest.approx(0.75), "patched_events": 1}
    nothing = reader.restricted_reads(rows, ["A3"], k=4, min_range=1.0)
    assert nothing["m1_events"] == 0 and nothing["patched_events"] == 0
