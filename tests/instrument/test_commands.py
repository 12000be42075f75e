"""`mistill instrument ...` on bad input: one clear line, exit status 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import yaml

from mistill.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _params(tmp_path, **instrument):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["demo"]["instrument"].update(instrument)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data))


def test_missing_traces_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, traces="nowhere/traces.jsonl", out_dir="out")
    assert main(["instrument", "events", "--profile", "demo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mistill: error: nowhere/traces.jsonl: no such trace file (run the traces stage first)"]
    assert not (tmp_path / "out").exists()


def test_malformed_trace_record_names_the_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces.jsonl").write_text('{"note_id": "a", "prompt": "p", "completion": "c"}\n'
                                           '{"note_id": "b", "prompt": "p"}\n')
    _params(tmp_path, traces="traces.jsonl", out_dir="out")
    assert main(["instrument", "attribute"]) == 2
    assert "traces.jsonl:2: malformed trace record (missing 'completion')" in capsys.readouterr().err


def test_unknown_instrument_key_is_rejected(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _params(tmp_path, nominee_topk=3)
    assert main(["instrument", "calibrate"]) == 2
    assert "unknown keys nominee_topk" in capsys.readouterr().err


def test_calibrate_without_attribution_says_what_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces.jsonl").write_text('{"note_id": "a", "prompt": "p", "completion": "c"}\n')
    _params(tmp_path, traces="traces.jsonl", out_dir="out")
    assert main(["instrument", "calibrate"]) == 2
    assert "run `mistill instrument events` first" in capsys.readouterr().err
