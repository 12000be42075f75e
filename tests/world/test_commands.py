"""`mistill world ...` end to end on a small demo profile, and bad input leaving nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mistill.cli import main
from mistill.io import read_jsonl

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["profile"] = "demo"
    world = params["demo"]["world"]
    world["notes"]["n_patients"] = 160
    world["corpora"]["char"].update(size=8, kept_section_variants=1)
    world["corpora"]["distill"].update(n_train=16, n_test=8)
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return root


def _run(root: Path, monkeypatch, *args: str) -> int:
    monkeypatch.chdir(root)
    return main(["world", *args])


def test_world_build_end_to_end(world, monkeypatch):
    for command in ("inventory", "notes", "corpora", "shortlists"):
        assert _run(world, monkeypatch, command) == 0, command
    data = world / "artifacts" / "data"
    inventory = [r["code"] for r in read_jsonl(data / "inventory.jsonl")]
    char, train, test = (read_jsonl(data / f"{n}.jsonl") for n in ("corpus_char", "dt_train", "dt_test"))
    assert len(char) == 9 and len(train) == 16 and len(test) == 8
    patients = [{r["patient_id"] for r in rows} for rows in (char, train, test)]
    assert len(patients[0]) == 8 and not (patients[0] & patients[1] or patients[0] & patients[2]
                                          or patients[1] & patients[2])
    assert {r["split"] for r in char} == {"char"} and all("discharge diagnosis" not in r["text"]
                                                           for r in train + test)
    shortlists = read_jsonl(data / "shortlists.jsonl")
    assert {r["note_id"] for r in shortlists} == {r["note_id"] for r in char + train + test}
    for row in shortlists:
        assert row["codes"] == [c for c in inventory if c in set(row["codes"])]      # shared order
    report = json.loads((data / "corpus_report.json").read_text())
    assert report["characterization"]["n_notes"] == 8 and report["section_cuts"]["n_notes_cut"] == 8 + 24
    recall = json.loads((data / "shortlists_recall.json").read_text())
    assert recall["k"] in recall["provenance"]["params"]["world.shortlist"]["k_grid"]
    for name in ("inventory", "notes"):
        assert json.loads((data / f"{name}.provenance.json").read_text())["code_version"]
    # stored shortlists are never regenerated silently
    before = (data / "shortlists.jsonl").read_bytes()
    assert _run(world, monkeypatch, "shortlists") == 2
    assert (data / "shortlists.jsonl").read_bytes() == before


def test_malformed_inventory_writes_no_notes(world, monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "params.yaml").write_text((world / "params.yaml").read_text())
    data = bad / "artifacts" / "data"
    data.mkdir(parents=True)
    (data / "inventory.jsonl").write_text('{"code": "N18.9", "description": "ckd"}\n{"code": "N18.1"\n')
    assert _run(bad, monkeypatch, "notes") == 2
    assert "inventory.jsonl:2: not a JSON object" in capsys.readouterr().err
    assert sorted(p.name for p in data.iterdir()) == ["inventory.jsonl"]


def test_gold_code_outside_inventory_writes_no_corpora(world, monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad"
    data = bad / "artifacts" / "data"
    data.mkdir(parents=True)
    (bad / "params.yaml").write_text((world / "params.yaml").read_text())
    source = world / "artifacts" / "data"
    (data / "inventory.jsonl").write_bytes((source / "inventory.jsonl").read_bytes())
    rows = read_jsonl(source / "notes.jsonl")
    rows[3]["gold_codes"].append("Z99.999")
    (data / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _run(bad, monkeypatch, "corpora") == 2
    assert "notes.jsonl:4: note" in capsys.readouterr().err
    assert sorted(p.name for p in data.iterdir()) == ["inventory.jsonl", "notes.jsonl"]
