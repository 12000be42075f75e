"""The evidence-flip population (App. N.2; R-D35): lock, frozen stages, draw, attempts, authoring, ledger."""

from __future__ import annotations

import json
import re
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from mistill.errors import UserError
from mistill.evaluate.evidence_flip import authoring, cohort, ledger
from mistill.evaluate.evidence_flip import commands as ef_commands
from mistill.evaluate.evidence_flip.freeze import check_lock, freeze, verify, write_lock
from mistill.io import write_json, write_jsonl
from mistill.world.demo_notes import COURSE_RULED_OUT, SECTIONS
from mistill.world.inventory import Inventory, write_inventory
from mistill.world.notes import note_to_row
from mistill.world.types import Code, Note

RULES = {"n_patients": 3, "seed": 0, "pairing": ["excludes1", "sibling"], "review_budget": 2, "samples": 1,
         "min_effect": 0.1}


def test_the_lock_refuses_other_rules_naming_the_rule(tmp_path):
    write_lock(tmp_path, RULES)
    write_lock(tmp_path, dict(RULES))               # the same rules: a no-op
    check_lock(tmp_path, RULES)
    with pytest.raises(UserError, match=r"LOCK.json: the cohort is locked to other rules \(n_patients: locked 3"):
        check_lock(tmp_path, {**RULES, "n_patients": 4})
    with pytest.raises(UserError, match="locked to other rules"):
        write_lock(tmp_path, {**RULES, "seed": 1})


def test_a_changed_byte_of_a_frozen_file_is_refused_in_one_line_naming_it(tmp_path):
    draw = tmp_path / "draw.jsonl"
    draw.write_text('{"note_id": "n1"}\n')
    freeze(tmp_path, "draw", [draw])
    verify(tmp_path, [draw])
    draw.write_text('{"note_id": "n2"}\n')          # one byte
    with pytest.raises(UserError) as err:
        verify(tmp_path, [draw])
    assert str(draw) in str(err.value) and "stage draw froze" in str(err.value) and "\n" not in str(err.value)
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(UserError, match="not frozen by any stage"):
        verify(tmp_path, [other])


def _note(i: int, split: str = "test", text: str = "chief complaint x", gold=("N18.3",)) -> Note:
    return Note(f"n{i:05d}-0", f"p{i:05d}", text, tuple(gold), split)


def test_the_draw_is_seeded_and_disjoint_from_development_cohorts():
    pool = [_note(i, "train" if i % 4 == 0 else "test") for i in range(40)]
    pool.append(Note("n00001-1", "p00001", "second admission", ("N18.3",), "test"))
    development = {f"p{i:05d}" for i in range(1, 10)}
    drawn = cohort.draw_patients(pool, development, {"train"}, n=12, seed=5)
    assert drawn == cohort.draw_patients(pool, development, {"train"}, n=12, seed=5)
    assert len(drawn) == len({n.patient_id for n in drawn}) == 12
    assert not {n.patient_id for n in drawn} & development
    assert all(n.split != "train" and n.note_id.endswith("-0") for n in drawn)
    assert len(cohort.draw_patients(pool, development, {"train"}, n=500, seed=5)) == 23   # every eligible patient


INVENTORY = Inventory([Code("E10.9", "type 1 diabetes mellitus without complications"),
                       Code("E11.9", "type 2 diabetes mellitus without complications"),
                       Code("E11.65", "type 2 diabetes mellitus with hyperglycemia"),
                       Code("N18.3", "chronic kidney disease stage 3"), Code("N18.4", "chronic kidney disease stage 4"),
                       Code("R51.9", "headache unspecified")])


def test_excludes1_partners_resolve_categories_of_the_icd_notes():
    # ICD-10-CM: E11 (type 2 diabetes) Excludes1 type 1 diabetes mellitus (E10.-)
    assert cohort.excludes1_partners("E11.9", INVENTORY) == ["E10.9"]
    assert cohort.excludes1_partners("N18.3", INVENTORY) == []
    note = _note(1, gold=("E11.9",))
    assert cohort.partner("E11.9", INVENTORY, ["excludes1", "sibling"], note) == "E10.9"
    assert cohort.partner("E11.9", INVENTORY, ["sibling"], note) == "E11.65"
    assert cohort.partner("N18.3", INVENTORY, ["excludes1"], _note(2)) is None
    assert cohort.partner("N18.3", INVENTORY, ["excludes1", "sibling"], _note(2, gold=("N18.3", "N18.4"))) is None


def test_attempts_follow_the_answer_and_stop_at_the_first_proposal():
    text = "course patient was found to have type 2 diabetes mellitus with hyperglycemia and headache unspecified"
    note = _note(1, text=text, gold=("N18.3", "R51.9", "E11.65", "E11.9"))
    completion = '</think>\n\n["N18.3", "E10.9", "R51.9", "E11.65", "E11.9"]'

    def spans(n, code):
        return authoring.evidence_spans(n, code, INVENTORY)

    got = cohort.attempts_for(note, completion, INVENTORY, ["excludes1"], spans)
    # N18.3: no words in the note; E10.9: not gold; R51.9: no Excludes1 partner in the inventory; E11.65 -> E10.9
    assert [(a.code, a.partner, a.failure) for a in got] == [
        ("N18.3", None, cohort.NO_EVIDENCE), ("R51.9", None, cohort.NO_PARTNER), ("E11.65", "E10.9", None)]
    counts = cohort.accounting([note, _note(2)], got, review_budget=5)
    assert counts == {"patients_drawn": 2, "candidate_attempts": 3, "rejected_attempts": 2,
                      "rejected_by_reason": {cohort.NO_EVIDENCE: 1, cohort.NO_PARTNER: 1, cohort.NO_WORDS_FOR_B: 0},
                      "proposals": 1, "patients_without_proposal": 1, "reviewed": 1, "not_reached": 0}


def _demo_note() -> Note:
    sections = {"chief complaint": "ckd", "history of present illness": "sixty year old man with chronic renal "
                "disease stage 3", "social history": "lives alone", "physical exam": "alert and oriented times three "
                "no acute distress", "pertinent results": "lactate normal", "brief hospital course": "patient was found "
                "to have chronic kidney disease stage 3 " + COURSE_RULED_OUT[0].format(d="headache unspecified"),
                "discharge medications": "aspirin"}
    text = "name unit no attending " + " ".join(f"{k} {sections[k]}" for k in SECTIONS if k in sections)
    return Note("n00007-0", "p00007", text, ("N18.3",), "test")


def test_the_flip_rewrites_every_evidence_span_and_the_controls_keep_their_promises():
    note = _demo_note()
    case = authoring.author_case("EF001", note, "N18.3", "N18.4", INVENTORY, seed=0)
    texts = case.texts
    # the verbatim description and its paraphrase ("chronic renal disease stage 3") are both evidence
    assert [note.text[s:e] for s, e in case.evidence["original"]] == ["chronic renal disease stage 3",
                                                                     "chronic kidney disease stage 3"]
    assert "stage 3" not in texts["flipped"] and texts["flipped"].count("chronic kidney disease stage 4") == 2
    assert [texts["flipped"][s:e] for s, e in case.evidence["flipped"]] == ["chronic kidney disease stage 4"] * 2
    # irrelevant edit: as many words as the flip rewrites (10), none of them evidence, same word count overall
    before, after = note.text.split(), texts["irrelevant"].split()
    assert len(before) == len(after) and sum(a != b for a, b in zip(before, after)) <= 10
    assert texts["irrelevant"].count("chronic kidney disease stage 3") == 1 and case.irrelevant_words_short == 0
    # order: the same words, physical exam and pertinent results swapped
    assert Counter(texts["order"].split()) == Counter(before) and texts["order"] != note.text
    assert texts["order"].index("pertinent results") < texts["order"].index("physical exam")
    assert authoring.approve(case, note, INVENTORY) == ("accept", "")


def test_the_approval_rule_gives_the_papers_reason_codes():
    note = _demo_note()
    incoherent = authoring.author_case("EF001", note, "N18.3", "R51.9", INVENTORY, seed=0)   # R51.9 is ruled out
    assert authoring.approve(incoherent, note, INVENTORY) == ("exclude", "no_coherent_flip")
    residual = Inventory([Code("N17.8", "other acute kidney failure"), Code("N17.9", "acute kidney failure unspecified")])
    renal = Note("n1", "p1", "course workup confirmed other acute kidney failure", ("N17.8",))
    case = authoring.author_case("EF002", renal, "N17.8", "N17.9", residual, seed=0)
    assert authoring.approve(case, renal, residual) == ("exclude", "pair")


def test_the_ledger_is_checked_line_by_line(tmp_path):
    path = tmp_path / "ledger.csv"
    ledger.write_ledger(path, {"EF001": ("accept", ""), "EF002": ("exclude", "pair")})
    assert ledger.read_ledger(path, ["EF001", "EF002"]) == {"EF001": ("accept", ""), "EF002": ("exclude", "pair")}
    path.write_text("case,decision,reason\nEF001,accept,\nEF002,exclude,tired\n")
    with pytest.raises(UserError, match=r"ledger.csv:3: EF002: an exclusion needs one of"):
        ledger.read_ledger(path, ["EF001", "EF002"])
    path.write_text("case,decision,reason\nEF001,accept,\n")
    with pytest.raises(UserError, match="1 reviewed case\\(s\\) undecided, first EF002"):
        ledger.read_ledger(path, ["EF001", "EF002"])


def _cohort_world(tmp_path):
    """A frozen cohort directory as ef-cohort leaves it, and params pointing at it."""
    data = tmp_path / "artifacts" / "data"
    data.mkdir(parents=True)
    write_inventory(data / "inventory.jsonl", INVENTORY)
    note = _demo_note()
    params = {"name": "test", "paths": {"artifacts": str(tmp_path / "artifacts")},
              "evidence_flip": {"out_dir": str(tmp_path / "EF"), "rules": RULES, "development": [],
                                "excluded_splits": ["train"], "authoring": "generator", "approval": "rule"}}
    settings = ef_commands.FlipSettings.from_params(params)
    root = settings.cohort_dir
    write_lock(root, RULES)
    write_jsonl(root / "draw.jsonl", [note_to_row(note)])
    attempt = cohort.Attempt(note.patient_id, note.note_id, "N18.3", "N18.4", None)
    write_json(root / "selection.json", {"reviewed": cohort.as_rows([attempt]),
                                         "accounting": cohort.accounting([note], [attempt], 2)})
    freeze(root, "draw", [root / "draw.jsonl"])
    freeze(root, "proposals", [root / "selection.json"])
    return params, settings


def test_ef_authored_reconciles_and_refuses_a_changed_selection(tmp_path, monkeypatch):
    params, settings = _cohort_world(tmp_path)
    monkeypatch.setattr(ef_commands, "_params", lambda: params)
    assert ef_commands.cmd_ef_authored(SimpleNamespace()) == 0
    row = json.loads((settings.cases_dir / "cohort_row.json").read_text())
    assert (row["patients_drawn"], row["proposals"], row["reviewed"], row["accepted"], row["excluded"]) == (1, 1, 1, 1, 0)
    case = json.loads((settings.cases_dir / "authored" / "EF001.json").read_text())
    assert set(case["texts"]) == set(authoring.CONDITIONS)
    selection = settings.cohort_dir / "selection.json"
    selection.write_text(re.sub("N18.4", "N18.5", selection.read_text()))
    with pytest.raises(UserError) as err:
        ef_commands.cmd_ef_authored(SimpleNamespace())
    assert str(selection) in str(err.value) and "frozen" in str(err.value) and "\n" not in str(err.value)


def test_ef_authored_refuses_rules_changed_after_the_lock(tmp_path, monkeypatch):
    params, _ = _cohort_world(tmp_path)
    params["evidence_flip"]["rules"] = {**RULES, "review_budget": 3}
    monkeypatch.setattr(ef_commands, "_params", lambda: params)
    with pytest.raises(UserError, match="review_budget: locked 2, params 3"):
        ef_commands.cmd_ef_authored(SimpleNamespace())


# ---- the behavioural half (R-D33) ---------------------------------------------------------------------------

from mistill.evaluate.evidence_flip import behaviour  # noqa: E402


def test_scores_follow_the_rule():
    assert behaviour.score('x\n["N18.3"]', "N18.3", "N18.4", valid=True) == 1
    assert behaviour.score('x\n["N18.4", "E11.9"]', "N18.3", "N18.4", valid=True) == -1
    assert behaviour.score('x\n["N18.3", "N18.4"]', "N18.3", "N18.4", valid=True) == 0
    assert behaviour.score('x\n["E11.9"]', "N18.3", "N18.4", valid=True) == 0
    assert behaviour.score('x\n["N18.3"]', "N18.3", "N18.4", valid=False) == 0   # invalid: 0, counted apart


def _rows(case, v_by_condition, valid=True):
    words = {1: '["N18.3"]', -1: '["N18.4"]', 0: "[]"}
    return [{"case": case, "condition": c, "sample": j, "completion": words[x], "valid": valid}
            for c, vs in v_by_condition.items() for j, x in enumerate(vs)]


def test_d_is_half_the_score_difference_and_decomposes():
    rows = _rows("EF001", {"original": [1, 1, 1, 0], "flipped": [-1, 0, 1, -1], "irrelevant": [1, 1, 0, 0],
                           "order": [1, 1, 1, 0]})
    reading = behaviour.readings(rows, {"EF001": ("N18.3", "N18.4")})["EF001"]
    assert reading.d == pytest.approx((0.75 - (-0.25)) / 2)
    assert reading.losing_a + reading.adopting_b == pytest.approx(reading.d)
    assert reading.losing_a == pytest.approx((0.75 - 0.25) / 2) and reading.adopting_b == pytest.approx(0.5 / 2)
    assert reading.paired_success == pytest.approx(0.25)      # sample 0 only: A-only then B-only
    assert reading.agreement("irrelevant") == pytest.approx(0.75) and reading.agreement("order") == 1.0
    with pytest.raises(ValueError, match="condition"):
        behaviour.readings([r for r in rows if r["condition"] != "order"], {"EF001": ("N18.3", "N18.4")})


def test_seed_pairs_are_matched_within_case_and_averaged():
    def reading(d_orig):
        return behaviour.CaseReading({"original": [d_orig], "flipped": [0], "irrelevant": [0], "order": [0]}, 0)

    treated = {0: {"a": reading(1), "b": reading(0)}, 1: {"a": reading(1), "b": reading(1)}}
    control = {0: {"a": reading(0), "b": reading(0)}, 1: {"a": reading(-1), "b": reading(0)}, 2: {"a": reading(0)}}
    got = behaviour.paired_case_differences(treated, control)
    # seed 0: a 0.5 - 0, b 0 - 0; seed 1: a 0.5 - (-0.5), b 0.5 - 0 (seed 2 has no treated partner)
    assert got == {"a": pytest.approx((0.5 + 1.0) / 2), "b": pytest.approx((0.0 + 0.5) / 2)}


def test_the_category_level_secondary_scores_by_three_character_category():
    # A = N18.3 and B = E11.9 lie in different categories; an answer counts for a category it names
    assert behaviour.score('x\n["N18.9"]', "N18.3", "E11.9", valid=True, level="category") == 1
    assert behaviour.score('x\n["N18.9"]', "N18.3", "E11.9", valid=True) == 0            # not A itself
    assert behaviour.score('x\n["E11.65", "I10"]', "N18.3", "E11.9", valid=True, level="category") == -1
    assert behaviour.score('x\n["N18.1", "E11.9"]', "N18.3", "E11.9", valid=True, level="category") == 0
    # a sibling pair shares its category: every answer scores 0 there
    assert behaviour.score('x\n["N18.3"]', "N18.3", "N18.4", valid=True, level="category") == 0
    with pytest.raises(ValueError, match="level"):
        behaviour.score("[]", "N18.3", "E11.9", valid=True, level="chapter")


def test_control_sensitivity_is_the_move_when_the_short_cases_are_left_out():
    def reading(irrelevant, order):
        return behaviour.CaseReading({"original": [1, 1], "flipped": [0, 0], "irrelevant": irrelevant,
                                      "order": order}, 0)

    # agreement with the original [1, 1]: a 1, b 0.5, c 0 (irrelevant); order agrees everywhere
    # A-only rate under irrelevant: a 1, b 0.5, c 0; under order 1 everywhere
    by_case = {"a": reading([1, 1], [1, 1]), "b": reading([1, 0], [1, 1]), "c": reading([0, -1], [1, 1])}
    second = {"a": reading([1, 1], [1, 1]), "b": reading([1, 1], [1, 1]), "c": reading([1, 1], [1, 1])}
    agreement, rate = behaviour.control_sensitivity({"one": by_case, "two": second}, kept=["a", "b"])
    # every case: (1 + 0.5 + 0) / 3 = 0.5; without c: 0.75; the second checkpoint does not move
    assert agreement == pytest.approx(0.25) and rate == pytest.approx(0.25)
    assert behaviour.control_sensitivity({"one": by_case}, kept=["a", "b", "c"]) == (0.0, 0.0)


def test_detectable_effect_matches_statsmodels_normal_power():
    from statsmodels.stats.power import NormalIndPower

    diffs = [0.1, -0.2, 0.3, 0.0, 0.25, -0.05, 0.15, 0.05]
    sd = float(np.std(diffs, ddof=1))
    effect = NormalIndPower().solve_power(nobs1=len(diffs), alpha=0.05, power=0.8, ratio=0)   # one-sample
    assert behaviour.detectable_effect(diffs) == pytest.approx(effect * sd, rel=1e-3)


# ---- the causal half (R-D34) -----------------------------------------------------------------------------------

from mistill.evaluate.evidence_flip import causal  # noqa: E402


def test_token_spans_pick_every_token_overlapping_the_evidence():
    offsets = [(0, 4), (4, 9), (9, 10), (10, 15), (15, 15), (15, 20)]
    assert causal.token_spans(offsets, [[2, 5]], at=2) == [1]              # chars [4, 7): the second token
    assert causal.token_spans(offsets, [[0, 2], [8, 13]], at=2) == [0, 3]  # [2, 4) and [10, 15); never an empty token
    assert causal.token_spans(offsets, [[13, 14]], at=2) == [5]            # [15, 16): not the empty token at 15
    assert causal.token_spans(offsets, [], at=0) == []


def test_the_sham_is_token_matched_outside_the_evidence_and_seeded():
    import random

    offsets = [(i, i + 1) for i in range(40)]
    target = [10, 11, 12]
    sham = causal.sham_tokens(offsets, (5, 30), target, 3, random.Random("0:EF001:original"))
    assert len(sham) == 3 and not set(sham) & set(target)
    assert all(5 <= i < 30 for i in sham) and sham == list(range(sham[0], sham[0] + 3))   # contiguous
    assert sham == causal.sham_tokens(offsets, (5, 30), target, 3, random.Random("0:EF001:original"))
    assert causal.sham_tokens(offsets, (5, 30), [], 0, random.Random(0)) == []            # an empty mask stays empty


def test_row_keys_find_the_evidence_tokens_of_the_note_in_its_chat_prompt():
    from tests.instrument.conftest import QwenTextTokenizer

    tokenizer = QwenTextTokenizer()
    note = "history of chronic kidney disease stage 3 physical exam lungs clear abdomen soft nontender"
    prompt = f"codes\nN18.3 chronic kidney disease stage 3\n\nDischarge summary:\n\n{note}\n\nanswer"
    start = note.index("chronic")
    keys = causal.row_keys(tokenizer, prompt, note, [[start, start + len("chronic kidney disease stage 3")]], "s")
    chat = tokenizer.chat_prompt(prompt)
    offsets = tokenizer.encode(chat).offsets
    words = "".join(chat[offsets[i][0]:offsets[i][1]] for i in keys.target)
    assert words.strip() == "chronic kidney disease stage 3"
    at = chat.index(note)      # the inventory line's words are never the target: only the note's
    assert all(offsets[i][0] >= at for i in keys.target + keys.sham)
    assert len(keys.sham) == len(keys.target) and not set(keys.sham) & set(keys.target)


def _reader(name):
    from pathlib import Path

    from mistill.repro.reader_module import load_reader

    return load_reader(Path(__file__).resolve().parents[2] / "readers" / f"{name}.py")


def accepted_cases_by_hand(root, cases) -> None:
    """`cases` authored (A N18.3, B N18.4, no short control), reconciled and frozen under root / "cases"."""
    cases_dir = root / "cases"
    for case in cases:
        write_json(cases_dir / "authored" / f"{case}.json", {"case": case, "note_id": "n1", "code": "N18.3",
                                                             "partner": "N18.4", "irrelevant_words_short": 0})
    write_json(cases_dir / "cohort_row.json", {"accepted_cases": cases})
    freeze(cases_dir, "authored", [cases_dir / "authored" / f"{c}.json" for c in cases])
    freeze(cases_dir, "reconciliation", [cases_dir / "cohort_row.json"])


def test_r_d34_reads_target_minus_sham_the_interaction_and_the_offset_by_hand(tmp_path):
    """Two cases, one sample: D per case is (v_original - v_flipped) / 2 from the hand-set answers."""
    root = tmp_path / "EF"
    cases = ["EF001", "EF002"]
    accepted_cases_by_hand(root, cases)
    answer = {1: '["N18.3"]', -1: '["N18.4"]', 0: "[]"}

    def write(path, v):      # v: case -> (v original, v flipped)
        write_jsonl(path, [{"note_id": f"{c}:{cond}:0", "case": c, "condition": cond, "sample": 0,
                            "completion": answer[x], "valid": True}
                           for c, (o, f) in v.items() for cond, x in (("original", o), ("flipped", f))])

    # D: clean EF001 1, EF002 0.5; teacher sham EF001 1, EF002 0; target EF001 0, EF002 0.5
    d_to_v = {1.0: (1, -1), 0.5: (1, 0), 0.0: (0, 0), -0.5: (0, 1)}
    runs = {("teacher_named", "clean"): [1.0, 0.5], ("teacher_named", "sham"): [1.0, 0.0],
            ("teacher_named", "target"): [0.0, 0.5], ("mistill", "clean"): [0.5, 0.5],
            ("mistill", "sham"): [0.5, 0.0], ("mistill", "target"): [0.0, 0.0],
            ("vanilla", "clean"): [0.5, 0.0], ("vanilla", "sham"): [0.5, 0.0], ("vanilla", "target"): [0.5, -0.5]}
    for (name, mask), ds in runs.items():
        write(root / "hf" / name / mask / "generations.jsonl", {c: d_to_v[d] for c, d in zip(cases, ds)})
    write_json(root / "hf" / "teacher_named" / "masks.json",     # EF002's flipped side has an empty target mask
               {"keys": {"EF001:original": {"target": 3, "sham": 3}, "EF001:flipped": {"target": 2, "sham": 2},
                         "EF002:original": {"target": 3, "sham": 3}, "EF002:flipped": {"target": 0, "sham": 0}}})
    write(root / "gen" / "teacher" / "generations.jsonl", {"EF001": (1, -1), "EF002": (1, -1)})   # D 1, 1
    for cond in ("irrelevant", "order"):   # the behavioural half reads all four conditions
        rows = [{"note_id": f"{c}:{cond}:0", "case": c, "condition": cond, "sample": 0, "completion": "[]",
                 "valid": True} for c in cases]
        path = root / "gen" / "teacher" / "generations.jsonl"
        path.write_text(path.read_text() + "".join(json.dumps(r) + "\n" for r in rows))
    params = {"name": "test", "evidence_flip": {"out_dir": str(root), "rules": RULES, "development": [],
                                                "excluded_splits": [], "authoring": "generator", "approval": "rule",
                                                "student": "qwen", "precision": "bf16",
                                                "causal": {"conditions": ["original", "flipped"], "sets": {
                                                    "teacher_named": {}, "mistill": {}, "vanilla": {}}}},
              "stats": {"bootstrap_resamples": 200}}
    values, _ = _reader("r_d34").compute_values(params)
    # target minus sham = mean over cases of D_sham - D_target
    assert values["target_minus_sham_teacher_named_pair"]["value"] == pytest.approx(((1 - 0) + (0 - 0.5)) / 2)
    assert values["target_minus_sham_mistill"]["value"] == pytest.approx(((0.5 - 0) + (0 - 0)) / 2)
    assert values["target_minus_sham_vanilla"]["value"] == pytest.approx(((0.5 - 0.5) + (0 + 0.5)) / 2)
    # L = G_sham - G_target per case: EF001 (0.5-0.5)-(0-0.5) = 0.5; EF002 (0-0)-(0+0.5) = -0.5
    assert values["interaction_l"]["value"] == pytest.approx(0.0)
    assert values["sensitivity_cases"]["value"] == 1          # EF002's empty flipped-side mask leaves it out
    assert "interaction_l_29_cases" not in values             # one case has no bootstrap
    assert values["target_minus_sham_teacher_named_pair_29_cases"]["value"] == pytest.approx(1.0)
    # the execution path: behavioural D (1, 1) minus clean HF D (1, 0.5)
    assert values["teacher_execution_path_offset"]["value"] == pytest.approx(0.25)
    assert values["teacher_d_hf_path"]["value"] == pytest.approx(0.75)


def test_r_d33_reads_the_fp32_secondary_pair_seed_for_seed_by_hand(tmp_path):
    """App. N.3's secondary: fp32 Mistill at its own pick minus fp32 Vanilla CoT-KD, seed-matched pair differences
    averaged within each case, read from the checkpoints params evidence_flip.secondary names."""
    root = tmp_path / "EF"
    cases = ["EF001", "EF002", "EF003"]
    accepted_cases_by_hand(root, cases)
    answer = {1: '["N18.3"]', -1: '["N18.4"]', 0: "[]"}
    d_to_v = {1.0: (1, -1), 0.5: (1, 0), 0.0: (0, 0)}

    def write(label, ds):     # one sample per case: D per case from (v original, v flipped); controls answer A
        rows = [{"case": c, "condition": cond, "sample": 0, "completion": answer[x], "valid": True}
                for c, d in zip(cases, ds) for cond, x in zip(("original", "flipped"), d_to_v[d])]
        rows += [{"case": c, "condition": cond, "sample": 0, "completion": answer[1], "valid": True}
                 for c in cases for cond in ("irrelevant", "order")]
        write_jsonl(root / "gen" / label / "generations.jsonl", rows)

    secondary = {"m0": ("mistill", 0, [1.0, 0.5, 0.0]), "m1": ("mistill", 1, [1.0, 1.0, 0.5]),
                 "v0": ("vanilla", 0, [0.5, 0.5, 0.0]), "v1": ("vanilla", 1, [0.0, 1.0, 0.5])}
    for label, (_, _, ds) in secondary.items():
        write(label, ds)
    params = {"name": "test", "distill": {"seeds": [0, 1]},
              "evidence_flip": {"out_dir": str(root), "rules": RULES, "development": [], "excluded_splits": [],
                                "authoring": "generator", "approval": "rule", "student": "qwen", "precision": "bf16",
                                "secondary": {label: {"objective": o, "seed": s, "model": f"runs/{label}"}
                                              for label, (o, s, _) in secondary.items()}},
              "stats": {"bootstrap_resamples": 200}}
    values, inputs = _reader("r_d33").compute_values(params)
    # per case, the mean over seeds 0 and 1 of D_mistill - D_vanilla: EF001 (0.5 + 1) / 2, EF002 (0 + 0) / 2,
    # EF003 (0 + 0) / 2
    assert values["secondary_delta_d_fp32"]["value"] == pytest.approx((0.75 + 0 + 0) / 3)
    low, high = values["secondary_delta_d_fp32_interval"]["value"]
    assert low <= values["secondary_delta_d_fp32"]["value"] <= high
    assert values["secondary_fp32_d_seeds"]["value"] == pytest.approx([0.5, 2.5 / 3, 1 / 3, 0.5])
    assert {p.parent.name for p in inputs if p.name == "generations.jsonl"} == set(secondary)
    assert "primary_delta_d_mistill_minus_vanilla_bf16" not in values   # no primary checkpoint answered
