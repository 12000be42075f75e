"""The privacy guard: planted note text, trace text and ids are caught, naming the file; clean output passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mistill import cli
from mistill.errors import UserError
from mistill.params import load_params
from mistill.repro.numbers import read_numbers, write_numbers
from mistill.repro.privacy import (
    GRAMMAR,
    IDENTIFIER,
    NOTE_TEXT,
    TRACE_TEXT,
    PrivacySettings,
    note_pseudonyms,
    run_privacy,
)
from mistill.repro.text_fields import artifact_problem, statistic_problem
from tests.repro.repro_helpers import REPO, write_fixture

NOTE_ID, PATIENT_ID, OTHER_NOTE_ID = "27412345", "19876543", "27499999"
NOTE_SENTENCE = "patient admitted with acute chest pain radiating to the left arm"
NOTE_TEXT_BODY = (f"chief complaint {NOTE_SENTENCE} and shortness of breath since yesterday evening "
                  "history of present illness hypertension treated with lisinopril at home")
TRACE_SENTENCE = "angina pectoris unspecified is documented in the summary accepted"


@pytest.fixture
def world(tmp_path: Path) -> dict:
    """Notes and traces of a paper-like profile, a clean numbers file and a clean paper build, in tmp_path."""
    data = tmp_path / "artifacts" / "data"
    data.mkdir(parents=True)
    (data / "corpus.jsonl").write_text(
        json.dumps({"note_id": NOTE_ID, "patient_id": PATIENT_ID, "text": NOTE_TEXT_BODY, "gold_codes": []}) + "\n"
        + json.dumps({"note_id": OTHER_NOTE_ID, "patient_id": "19800000", "text": "stable follow up visit"}) + "\n")
    traces = tmp_path / "artifacts" / "TR-006"
    traces.mkdir(parents=True)
    (traces / "traces.jsonl").write_text(json.dumps({
        "note_id": NOTE_ID, "prompt": "code this note",
        "completion": f"<think> the summary documents chest pain. I20.9 {TRACE_SENTENCE}. </think> [\"I20.9\"]"}) + "\n")
    per_note = tmp_path / "artifacts" / "HD-001" / NOTE_ID
    per_note.mkdir(parents=True)
    (per_note / "events.jsonl").write_text("{}\n")
    params = {"profile": "paper", "paths": {"results": "results", "artifacts": "artifacts"},
              "privacy": {"notes": ["artifacts/data/corpus.jsonl"], "traces": ["artifacts/TR-006/traces.jsonl"],
                          "require_sources": True, "hash_note_ids": True}}
    tables = tmp_path / "paper" / "build" / "tables"
    tables.mkdir(parents=True)
    (tables / "table1.tex").write_text("\\begin{tabular}{lr}\nknock-in, top-40 & 0.860 \\\\\n"
                                       "median over notes & 0.27412345 \\\\\n\\end{tabular}\n")
    (tmp_path / "paper" / "build" / "macros.tex").write_text("\\newcommand{\\RCthreeKnockinTopFortyPOne}{0.86}\n")
    return {"root": tmp_path, "params": params, "results": tmp_path / "results", "build": tmp_path / "paper" / "build"}


def _scan(world: dict, params: dict | None = None):
    root = world["root"]
    return run_privacy(params or world["params"], [world["results"], world["build"]], root=root)


def _write_clean_numbers(world: dict, registry, params: dict | None = None) -> Path:
    values = {"knockin_top40_p1": {"value": 0.86, "statistic": "median over notes",
                                   "artifact": f"artifacts/HD-001/{NOTE_ID}/events.jsonl"}}
    per_note = world["root"] / "artifacts" / "HD-001" / NOTE_ID / "events.jsonl"
    return write_numbers("R-C3", values, reader="readers/r_c3.py", inputs=[per_note.relative_to(world["root"])],
                         params=params or world["params"], results_dir=world["results"], root=world["root"],
                         registry=registry)


def _leaks_nothing(report) -> None:
    """Findings name files and places, never the leaked text or id."""
    for finding in report.findings:
        line = finding.format()
        assert "\n" not in line
        assert NOTE_ID not in line and PATIENT_ID not in line
        assert "chest pain" not in line and "pectoris" not in line


# ---- a clean tree passes; what is planted is caught, naming the file --------------------------------


def test_clean_fixture_passes(world, registry, monkeypatch):
    monkeypatch.chdir(world["root"])         # hash_inputs names inputs as given (relative to the root)
    path = _write_clean_numbers(world, registry)
    text = path.read_text()
    assert NOTE_ID not in text                          # per-note path and artifact: pseudonyms
    assert read_numbers(path, registry).values["knockin_top40_p1"]["artifact"].startswith("artifacts/HD-001/note-")
    report = _scan(world)
    assert report.findings == [] and report.files == 3
    assert report.shingles > 0 and report.identifiers == 4          # two notes, two patients


def test_planted_note_sentence_in_numbers_fields_is_caught(world, registry):
    path = write_fixture(world["results"], "R-C3", {
        "knockin_top40_p1": {"value": 0.86, "statistic": NOTE_SENTENCE, "artifact": "artifacts/HD-001"},
        "knockin_top8_p1": {"value": 0.5, "statistic": "median over notes", "artifact": NOTE_SENTENCE}})
    report = _scan(world)
    found = {(f.path, f.where, f.kind) for f in report.findings}
    assert (path, "values.knockin_top40_p1.statistic", GRAMMAR) in found
    assert (path, "values.knockin_top8_p1.artifact", GRAMMAR) in found
    assert {(f.path, f.kind) for f in report.findings if f.where.startswith("line ")} == {(path, NOTE_TEXT)}
    _leaks_nothing(report)


def test_check_and_write_reject_a_planted_sentence(world, registry):
    path = write_fixture(world["results"], "R-C3", {
        "knockin_top40_p1": {"value": 0.86, "statistic": NOTE_SENTENCE, "artifact": "artifacts/HD-001"}})
    with pytest.raises(UserError, match="statistic has .* words outside the statistic vocabulary") as err:
        read_numbers(path, registry)
    assert str(err.value).startswith(str(path)) and "chest" not in str(err.value)
    for field in ("statistic", "artifact"):
        record = {"value": 0.86, "statistic": "median over notes", "artifact": "artifacts/HD-001", field: NOTE_SENTENCE}
        with pytest.raises(UserError, match=f"knockin_top40_p1: {field} ") as err:
            write_numbers("R-C3", {"knockin_top40_p1": record}, reader="r", inputs=[], params={"profile": "paper"},
                          results_dir=world["root"] / "out", registry=registry)
        assert "chest" not in str(err.value)
    assert not (world["root"] / "out").exists()


def test_planted_note_sentence_in_paper_build_is_caught(world):
    tex = world["build"] / "tables" / "table1.tex"
    tex.write_text(tex.read_text() + f"% {NOTE_SENTENCE.upper()}, as the note says\n")
    report = _scan(world)
    assert [(f.path, f.where, f.kind) for f in report.findings] == [(tex, "line 5", NOTE_TEXT)]
    assert "artifacts/data/corpus.jsonl" in report.findings[0].format()
    _leaks_nothing(report)


def test_planted_trace_sentence_is_caught(world):
    md = world["build"] / "tables" / "table1.md"
    md.write_text(f"| example |\n|---|\n| {TRACE_SENTENCE} |\n")
    report = _scan(world)
    assert [(f.path, f.where, f.kind) for f in report.findings] == [(md, "line 3", TRACE_TEXT)]


def test_note_and_patient_ids_are_caught_as_whole_tokens(world):
    tex = world["build"] / "tables" / "table1.tex"
    tex.write_text(tex.read_text() + f"worst note: {NOTE_ID} \\\\\n")
    md = world["build"] / "notes.md"
    md.write_text(f"patient {PATIENT_ID}-a\nnot an id: 127412345 or 0.{NOTE_ID}\n")
    report = _scan(world)
    assert [(f.path, f.where, f.kind) for f in report.findings] == [(md, "line 1", IDENTIFIER),
                                                                      (tex, "line 5", IDENTIFIER)]
    _leaks_nothing(report)


def test_note_id_in_numbers_inputs_is_caught_unless_the_profile_keeps_ids(world):
    path = write_fixture(world["results"], "R-C3", {
        "knockin_top40_p1": {"value": 0.86, "statistic": "median over notes", "artifact": "artifacts/HD-001"}})
    record = json.loads(path.read_text())
    record["inputs"] = {f"artifacts/HD-001/{NOTE_ID}/events.jsonl": "0" * 64}
    path.write_text(json.dumps(record, indent=2))
    report = _scan(world)
    assert [(f.path, f.where, f.kind) for f in report.findings] == [(path, "key 1 of inputs", IDENTIFIER)]
    _leaks_nothing(report)

    keeps_ids = {**world["params"], "privacy": {**world["params"]["privacy"], "hash_note_ids": False}}
    assert _scan(world, keeps_ids).findings == []
    record["values"]["knockin_top40_p1"]["artifact"] = f"artifacts/HD-001/{NOTE_ID}/events.jsonl"
    path.write_text(json.dumps(record, indent=2))
    assert [(f.where, f.kind) for f in _scan(world, keeps_ids).findings] == [
        ("values.knockin_top40_p1.artifact", IDENTIFIER)]


def test_pseudonyms_are_stable_and_name_no_id(world):
    settings = PrivacySettings.from_params(world["params"])
    first, again = note_pseudonyms(settings, world["root"]), note_pseudonyms(settings, world["root"])
    path = f"artifacts/HD-001/{NOTE_ID}/events.jsonl"
    assert first.path(path) == again.path(path) != path and NOTE_ID not in first.path(path)
    assert first.path(f"artifacts/TR-008/{NOTE_ID}.json").endswith(".json")
    assert first.path("artifacts/HD-001/calibration.json") == "artifacts/HD-001/calibration.json"
    assert first.artifact(f"artifacts/M6-a/{NOTE_ID} vs artifacts/M6-b/{OTHER_NOTE_ID}").count(" vs ") == 1


# ---- missing sources ------------------------------------------------------------------------------------


def test_missing_sources_are_an_error_when_required(world):
    (world["root"] / "artifacts" / "TR-006" / "traces.jsonl").unlink()
    with pytest.raises(UserError, match=r"artifacts/TR-006/traces.jsonl: no such file, and privacy.require_sources"):
        _scan(world)


def test_missing_sources_are_said_and_the_grammar_still_checked_when_not_required(world):
    for source in ("data/corpus.jsonl", "TR-006/traces.jsonl"):
        (world["root"] / "artifacts" / source).unlink()
    params = {**world["params"], "privacy": {**world["params"]["privacy"], "require_sources": False,
                                             "hash_note_ids": False}}
    path = write_fixture(world["results"], "R-C3", {
        "knockin_top40_p1": {"value": 0.86, "statistic": NOTE_SENTENCE, "artifact": "artifacts/HD-001"}})
    report = _scan(world, params)
    assert any("no note or trace text at" in n for n in report.notes)
    assert [(f.path, f.kind) for f in report.findings] == [(path, GRAMMAR)]


def test_malformed_settings_are_one_line(world):
    with pytest.raises(UserError, match=r"paper.privacy.hash_note_ids must be true or false"):
        PrivacySettings.from_params({"profile": "paper", "privacy": {"hash_note_ids": "yes"}})
    with pytest.raises(UserError, match=r"unknown setting 'note'"):
        PrivacySettings.from_params({"profile": "paper", "privacy": {"note": []}})


# ---- the command ---------------------------------------------------------------------------------------


def test_command_exits_non_zero_with_one_line_per_finding(world, monkeypatch, capsys):
    (world["root"] / "params.yaml").write_text(yaml.safe_dump({"profile": "paper", "paper": world["params"]}))
    monkeypatch.chdir(world["root"])
    assert cli.main(["repro", "privacy"]) == 0
    assert capsys.readouterr().out.strip().endswith("clean")
    (world["build"] / "tables" / "table1.tex").write_text(f"{NOTE_SENTENCE}\n{NOTE_ID}\n")
    extra = world["root"] / "release.log"
    extra.write_text(f"processing note {NOTE_ID}\n")
    assert cli.main(["repro", "privacy", "release.log"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == ["paper/build/tables/table1.tex: line 1: note text (a run of 8 tokens from "
                     "artifacts/data/corpus.jsonl)",
                     "paper/build/tables/table1.tex: line 2: note or patient identifier (a whole token)",
                     "release.log: line 1: note or patient identifier (a whole token)"]
    assert "2 files" in captured.out
    assert cli.main(["repro", "privacy", "absent.log"]) == 2


# ---- the grammar and the committed tree ----------------------------------------------------------------


def _committed_statistics() -> tuple[set[str], set[str]]:
    statistics, artifacts = set(), set()
    for path in sorted((REPO / "results").glob("*.json")):
        for record in json.loads(path.read_text())["values"].values():
            statistics.add(record["statistic"])
            artifacts.add(record["artifact"])
    for path in sorted((REPO / "results" / "expected").glob("*.yaml")):
        for values in yaml.safe_load(path.read_text())["expected"].values():
            statistics.update(str(v["stat"]) for v in values.values() if isinstance(v, dict) and "stat" in v)
    return statistics, artifacts


def test_grammar_accepts_every_committed_statistic_and_artifact():
    statistics, artifacts = _committed_statistics()
    assert len(statistics) > 100 and artifacts
    assert {s: statistic_problem(s) for s in statistics if statistic_problem(s)} == {}
    assert {a: artifact_problem(a) for a in artifacts if artifact_problem(a)} == {}


@pytest.mark.parametrize("text, problem", [
    (NOTE_SENTENCE, "words outside the statistic vocabulary"),
    ("median over notes \u2264 3", "character outside the grammar at position 19"),
    ("median " * 50, "characters (at most 320)"),
    ("", "non-empty"),
])
def test_grammar_rejects_free_text_in_statistics(text, problem):
    assert problem in statistic_problem(text)


@pytest.mark.parametrize("text", [NOTE_SENTENCE, "artifacts/HD-001, the patient was admitted", "a\tb", ""])
def test_grammar_rejects_free_text_in_artifacts(text):
    assert artifact_problem(text)


def test_committed_results_pass_under_the_demo_profile():
    params = load_params(REPO / "params.yaml", profile="demo")
    report = run_privacy(params, [REPO / "results"], root=REPO)
    assert report.findings == [], [f.format() for f in report.findings]
