from __future__ import annotations

from collections import Counter

import pytest

from mistill.errors import UserError
from mistill.world import icd
from mistill.world.corpora import (
    Eligibility,
    characterization_traces,
    cut_discharge_diagnosis,
    quartile_strata,
    select_characterization,
    select_distillation,
)
from mistill.world.demo_notes import NoteGeneratorConfig, generate_notes
from mistill.world.inventory import Inventory
from mistill.world.types import Code, Note

WIDE = Eligibility(min_words=1, max_words=10_000, min_codes=1, max_codes=100)

# Categories from five different ICD-10 blocks.
BLOCK_INV = Inventory([
    Code("N18.9", "ckd"), Code("N18.1", "ckd 1"),          # N17-N19
    Code("E11.9", "t2dm"), Code("E10.9", "t1dm"),          # E08-E13
    Code("I10", "htn"),                                     # I10-I1A
    Code("J45.909", "asthma"),                              # J40-J4A
    Code("K21.9", "gerd"),                                  # K20-K31
])


def test_blocks_come_from_the_icd_hierarchy():
    assert icd.block("N18.9") == "N17-N19"
    assert icd.block("E11.9") == icd.block("E10.9") == "E08-E13"
    assert icd.chapter("N18.9") == "14"
    assert icd.block("ZZZ.9") == "ZZZ"                        # unknown codes count as their category


def test_quartile_strata_hand_worked():
    counts = [1, 2, 3, 4, 5, 6, 7, 8]                         # q1=2.75, q2=4.5, q3=6.25
    assert quartile_strata(counts) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert quartile_strata([5, 5, 5, 5]) == [0, 0, 0, 0]      # ties fall in the lowest stratum


def _note(note_id, patient, codes, split="test", words=10):
    return Note(note_id, patient, " ".join(["word"] * words), tuple(codes), split)


def test_greedy_coverage_hand_made_example():
    # One stratum (every note has 2 codes).  Greedy: a covers 2 new blocks; then c covers 2 new
    # (b would add only 1, d none); then b covers the last new block (K20-K31)... d never beats b.
    notes = [
        _note("a", "p1", ["N18.9", "E11.9"]),                 # N17-N19, E08-E13
        _note("b", "p2", ["N18.1", "K21.9"]),                 # N17-N19, K20-K31
        _note("c", "p3", ["I10", "J45.909"]),                 # I10-I1A, J40-J4A
        _note("d", "p4", ["E10.9", "N18.1"]),                 # nothing new after a
    ]
    picked = select_characterization(notes, BLOCK_INV, eligibility=WIDE, size=3, source_split="test", seed=0)
    assert [n.note_id for n in picked.notes] == ["a", "c", "b"]
    assert picked.covered_blocks == {"N17-N19", "E08-E13", "I10-I1A", "J40-J4A", "K20-K31"}


def test_one_note_per_patient_and_eligibility():
    notes = [
        _note("a", "p1", ["N18.9", "E11.9"]),
        _note("a2", "p1", ["I10", "J45.909"]),                # same patient: never both
        _note("b", "p2", ["K21.9", "I10"]),
        _note("t", "p3", ["J45.909", "E10.9"], split="train"),  # wrong split
        _note("s", "p4", ["N18.1", "E10.9"], words=500),        # too long
    ]
    rule = Eligibility(min_words=1, max_words=100, min_codes=2, max_codes=5)
    picked = select_characterization(notes, BLOCK_INV, eligibility=rule, size=2, source_split="test", seed=0)
    assert len({n.patient_id for n in picked.notes}) == 2
    assert {n.note_id for n in picked.notes} <= {"a", "a2", "b"}
    with pytest.raises(UserError, match="only 2 eligible notes of distinct patients"):
        select_characterization(notes, BLOCK_INV, eligibility=rule, size=3, source_split="test", seed=0)


@pytest.fixture(scope="module")
def pool(demo_inv):
    return generate_notes(demo_inv, NoteGeneratorConfig(n_patients=300), seed=0)


def test_stratified_over_code_count_quartiles(demo_inv, pool):
    rule = Eligibility(min_words=100, max_words=1000, min_codes=3, max_codes=10)
    picked = select_characterization(pool, demo_inv, eligibility=rule, size=16, source_split="test", seed=0)
    per_stratum = Counter(picked.strata.values())
    assert per_stratum == {0: 4, 1: 4, 2: 4, 3: 4}
    counts = {n.note_id: len(n.gold_codes) for n in picked.notes}
    q1, q2, q3 = picked.cut_points
    for note_id, stratum in picked.strata.items():
        low, high = [(-1, q1), (q1, q2), (q2, q3), (q3, 99)][stratum]
        assert low < counts[note_id] <= high
    again = select_characterization(pool, demo_inv, eligibility=rule, size=16, source_split="test", seed=0)
    assert again.notes == picked.notes


def test_distillation_corpus_disjoint_one_per_patient(demo_inv, pool):
    rule = Eligibility(min_words=100, max_words=1000, min_codes=3, max_codes=10)
    char = select_characterization(pool, demo_inv, eligibility=rule, size=16, source_split="test", seed=0)
    char_patients = {n.patient_id for n in char.notes}
    train, test = select_distillation(pool, demo_inv, eligibility=rule, n_train=40, n_test=20,
                                      source_split="train", exclude_patients=char_patients, seed=0)
    assert len(train) == 40 and len(test) == 20
    patients_train, patients_test = {n.patient_id for n in train}, {n.patient_id for n in test}
    assert len(patients_train) == 40 and len(patients_test) == 20
    assert not patients_train & patients_test
    assert not (patients_train | patients_test) & char_patients
    # the exclusion holds even when excluded patients sit in the source split
    train_all, _ = select_distillation(pool, demo_inv, eligibility=None, n_train=10, n_test=0,
                                       source_split="train", exclude_patients={n.patient_id for n in train},
                                       seed=0)
    assert not {n.patient_id for n in train_all} & patients_train
    with pytest.raises(UserError, match="need 100000"):
        select_distillation(pool, demo_inv, eligibility=None, n_train=100000, n_test=0, source_split="train",
                            exclude_patients=(), seed=0)


def test_discharge_diagnosis_cut_is_logged():
    text = ("history of present illness cough brief hospital course treated for pneumonia "
            "discharge diagnosis primary pneumonia secondary asthma discharge condition stable "
            "discharge diagnoses copd")
    cut, cuts = cut_discharge_diagnosis(text)
    assert cut == ("history of present illness cough brief hospital course treated for pneumonia "
                   "discharge condition stable")
    assert [(c.words_removed, c.next_header) for c in cuts] == [(6, "discharge condition"), (3, None)]
    assert text[cuts[0].start:cuts[0].end].strip() == "discharge diagnosis primary pneumonia secondary asthma"
    assert cut_discharge_diagnosis("no such section") == ("no such section", [])


def test_generated_notes_lose_the_diagnosis_section_only(demo_inv, pool):
    rule = Eligibility(min_words=100, max_words=1000, min_codes=3, max_codes=10)
    char = select_characterization(pool, demo_inv, eligibility=rule, size=8, source_split="test", seed=0)
    traces = characterization_traces(char, cut=True, kept_section_variants=2)
    assert len(traces) == 10 and len({t.patient_id for t in traces}) == 8
    for trace in traces[:8]:
        assert "discharge diagnosis" not in trace.text and "discharge condition" in trace.text
        assert len(trace.meta["section_cut"]) == 1 and trace.split == "char"
    for variant, original in zip(traces[8:], char.notes[:2]):
        assert variant.note_id == original.note_id + "-kept" and variant.text == original.text
        assert variant.meta["variant_of"] == original.note_id
