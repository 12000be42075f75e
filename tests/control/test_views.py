"""A run's notes under another run's global sets (R-C14's KI-A-orig): what the knock-in pass reads."""

from __future__ import annotations

import os

import pytest

from mistill.control.views import write_view
from mistill.errors import UserError


def _run(root, notes):
    for note in notes:
        for name in ("events.jsonl", "attr.npz"):
            (root / note).mkdir(parents=True, exist_ok=True)
            (root / note / name).write_text(f"{note} {name}")
            (root / note / f"{name}.meta.json").write_text(f'{{"of": "{note} {name}"}}')
        (root / note / "patch2.jsonl").write_text("the run's own knock-in, not viewed")
    (root / "head_sets_contrast.json").write_text('{"sets": "the new run\'s"}')


def test_the_view_holds_the_runs_notes_under_the_other_sets(tmp_path):
    run, view, sets = tmp_path / "HD-A", tmp_path / "KI-A-orig", tmp_path / "HD-001-sets.json"
    _run(run, ["n0", "n1"])
    sets.write_text('{"sets": "the original run\'s"}')
    assert write_view(run, sets, view) == 2
    assert (view / "head_sets_contrast.json").read_text() == sets.read_text()
    for note in ("n0", "n1"):
        for name in ("events.jsonl", "events.jsonl.meta.json", "attr.npz", "attr.npz.meta.json"):
            assert (view / note / name).read_bytes() == (run / note / name).read_bytes()
        assert not (view / note / "patch2.jsonl").exists()
    # again: unchanged files are left as they are (the knock-in pass keeps its valid patches beside them)
    (view / "n0" / "patch2.jsonl").write_text("the view's knock-in")
    before = os.stat(view / "n0" / "events.jsonl").st_mtime_ns
    (run / "n1" / "events.jsonl").write_text("n1 re-extracted")
    assert write_view(run, sets, view) == 2 and os.stat(view / "n0" / "events.jsonl").st_mtime_ns == before
    assert (view / "n0" / "patch2.jsonl").read_text() == "the view's knock-in"
    assert (view / "n1" / "events.jsonl").read_text() == "n1 re-extracted"
    # a note gone from the run leaves the view
    for path in (run / "n1").iterdir():
        path.unlink()
    (run / "n1").rmdir()
    assert write_view(run, sets, view) == 1 and not (view / "n1").exists()


def test_the_view_refuses_what_the_knock_in_could_not_read(tmp_path):
    run, sets = tmp_path / "HD-A", tmp_path / "sets.json"
    with pytest.raises(UserError, match="no head sets"):
        write_view(run, sets, tmp_path / "view")
    sets.write_text("{}")
    with pytest.raises(UserError, match="no <note>/events.jsonl"):
        write_view(run, sets, tmp_path / "view")
    _run(run, ["n0"])
    (run / "n0" / "attr.npz.meta.json").unlink()
    with pytest.raises(UserError, match="attr.npz.meta.json: missing; the run's `attribute` pass"):
        write_view(run, sets, tmp_path / "view")
