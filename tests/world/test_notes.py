from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from mistill.errors import UserError
from mistill.world.demo_notes import NoteGeneratorConfig, generate_notes, paraphrase
from mistill.world.notes import load_notes, validate_notes, write_notes
from mistill.world.types import Note

CONFIG = NoteGeneratorConfig(n_patients=120)


@pytest.fixture(scope="module")
def pool(demo_inv):
    return generate_notes(demo_inv, CONFIG, seed=3)


def test_generator_is_deterministic_by_seed(demo_inv, pool):
    assert generate_notes(demo_inv, CONFIG, seed=3) == pool
    other = generate_notes(demo_inv, CONFIG, seed=4)
    assert [n.text for n in other] != [n.text for n in pool]


def test_notes_shape(demo_inv, pool):
    for note in pool:
        assert CONFIG.min_gold <= len(note.gold_codes) <= CONFIG.max_gold
        assert len(set(note.gold_codes)) == len(note.gold_codes)
        assert all(code in demo_inv for code in note.gold_codes)
        assert re.fullmatch(r"[a-z0-9 ]+", note.text)               # lower-cased, unpunctuated
        assert 150 <= len(note.text.split()) <= 600                  # a few hundred words
        assert note.split in {"train", "val", "test"}
    per_patient = Counter(n.patient_id for n in pool)
    assert set(per_patient.values()) == {1, 2}                       # some patients have two notes
    for patient in per_patient:                                      # splits are by patient
        assert len({n.split for n in pool if n.patient_id == patient}) == 1


def test_gold_descriptions_appear_and_siblings_are_ruled_out(demo_inv, pool):
    body = lambda text: text.split(" discharge medications ")[0]     # before the diagnosis section
    for note in pool:
        for code in note.gold_codes:
            assert f" {demo_inv[code].description} " in f" {body(note.text)} "
    ruled_out = 0
    for note in pool:
        for code in note.gold_codes:
            for sibling in demo_inv.siblings(code):
                if sibling in note.gold_codes:
                    continue
                d = demo_inv[sibling].description
                if re.search(rf"(no evidence of|workup negative for|doubt|concerning for) {re.escape(d)}\b"
                             rf"|\b{re.escape(d)} was ruled out", note.text):
                    ruled_out += 1
    assert ruled_out >= len(pool)                                    # near-misses are common


def test_paraphrase_uses_the_synonym_table():
    import random
    assert paraphrase("chronic kidney disease", random.Random(0), 0.0) == "chronic kidney disease"
    assert paraphrase("malignant neoplasm of colon", random.Random(0), 1.0).split()[0] in {"cancer", "malignancy"}


def test_notes_round_trip_and_meta(tmp_path, pool):
    path = tmp_path / "notes.jsonl"
    write_notes(path, pool[:5])
    loaded = load_notes(path)
    assert loaded == pool[:5]
    assert loaded[0].meta["source_split"] == pool[0].split


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_note_without_text_is_a_user_error(tmp_path, small_inv):
    path = tmp_path / "notes.jsonl"
    _write_rows(path, [{"note_id": "a", "patient_id": "p", "text": "ckd", "gold_codes": ["N18.9"]},
                       {"note_id": "b", "patient_id": "p", "text": "   ", "gold_codes": ["N18.9"]}])
    with pytest.raises(UserError, match=r"notes.jsonl:2: note b has no text"):
        load_notes(path)


def test_gold_code_not_in_inventory_is_a_user_error(tmp_path, small_inv):
    path = tmp_path / "notes.jsonl"
    _write_rows(path, [{"note_id": "a", "patient_id": "p", "text": "ckd", "gold_codes": ["N18.9", "Z99.9"]}])
    assert load_notes(path)[0].gold_codes == ("N18.9", "Z99.9")      # without an inventory: not checked
    with pytest.raises(UserError, match=r"notes.jsonl:1: note a: gold code Z99.9 is not in the inventory"):
        load_notes(path, small_inv)
    with pytest.raises(UserError, match="Z99.9"):
        validate_notes([Note("a", "p", "ckd", ("Z99.9",))], small_inv)


def test_generator_config_rejects_bad_values():
    with pytest.raises(UserError):
        NoteGeneratorConfig(min_gold=5, max_gold=3).check()
    with pytest.raises(UserError):
        NoteGeneratorConfig.from_params({"split_shares": {"train": 0.5, "test": 0.2}})
