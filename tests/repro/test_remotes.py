"""Publishing: each cached output to the profile's private or shareable DVC remote, the shareable ones
checked by the privacy guard first (params `remotes`, `mistill repro publish`, `privacy --shareable`)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mistill.errors import UserError
from mistill.params import load_params
from mistill.repro.privacy import IDENTIFIER, NOTE_TEXT
from mistill.repro.remotes import (
    PRIVATE,
    SHAREABLE,
    RemoteSettings,
    StageOutput,
    check_shareable,
    plan_publish,
)
from tests.repro.repro_helpers import REPO

NOTE = ("the patient was admitted with chronic kidney disease stage four and worsening edema of both legs "
        "after missing two sessions of dialysis at the outpatient center")
REMOTES = {"private": "vault", "shareable": "open",
           "shareable_outputs": ["out/summary.json", "out/numbers/*.json", "out/by_note"]}


def _params(**remotes):
    return {"profile": "t", "remotes": {**REMOTES, **remotes},
            "privacy": {"notes": ["data/notes.jsonl"], "traces": [], "require_sources": True,
                        "hash_note_ids": False}}


def test_both_profiles_name_their_remotes_and_list_only_numbers_files_as_shareable():
    demo, paper = (RemoteSettings.from_params(load_params(REPO / "params.yaml", p)) for p in ("demo", "paper"))
    assert demo.private == demo.shareable == "local"                      # the shipped default remote
    assert paper.private != paper.shareable                               # access-controlled vs shareable
    for settings in (demo, paper):
        for private in ("artifacts/data/notes.jsonl", "artifacts/TR-006/traces.jsonl", "artifacts/HD-001",
                        "artifacts/DT-eval/student-qwen-mistill-bf16-s0", "artifacts/DT-targets",
                        "artifacts/TR-008/events", "artifacts/data/inventory.jsonl"):
            assert settings.classify(private) == PRIVATE, private
        assert settings.classify("artifacts/data/shortlists_recall.json") == SHAREABLE


def test_the_shipped_dvc_config_names_the_demo_remote_outside_the_work_tree():
    config = (REPO / ".dvc" / "config").read_text()
    assert "remote = local" in config and "url = ~/.cache/mistill-repro/dvc-remote" in config


@pytest.mark.parametrize("section, message", [
    (None, "missing; name the profile's DVC remotes"),
    ({"private": "a"}, "remotes.shareable must name a DVC remote"),
    ({"private": "a", "shareable": "b", "shareable_outputs": "x"}, "must be a list of output paths"),
    ({"private": "a", "shareable": "b", "public": "c"}, "unknown setting 'public'"),
])
def test_bad_remote_settings_are_one_line_errors(section, message):
    with pytest.raises(UserError, match=message):
        RemoteSettings.from_params({"profile": "t", **({"remotes": section} if section is not None else {})})


def test_an_output_is_private_unless_listed_and_the_plan_says_where_each_goes():
    settings = RemoteSettings.from_params(_params())
    outputs = [StageOutput("notes", "data/notes.jsonl", True, True),
               StageOutput("s", "out/summary.json", True, True),
               StageOutput("n", "out/numbers/a.json", True, True),
               StageOutput("n2", "out/numbers/deeper/a.json", True, True),   # fnmatch's * crosses "/": listed
               StageOutput("r", "results/R-C1.json", False, True),
               StageOutput("later", "out/later.json", True, False)]
    plan = plan_publish(settings, outputs)
    assert [o.path for o in plan.pushes["vault"]] == ["data/notes.jsonl"]
    assert [o.path for o in plan.pushes["open"]] == ["out/summary.json", "out/numbers/a.json",
                                                     "out/numbers/deeper/a.json"]
    assert [o.path for o in plan.in_git] == ["results/R-C1.json"]
    assert [o.path for o in plan.not_built] == ["out/later.json"]
    assert [o.path for o in plan_publish(settings, outputs, ["out/numbers"]).pushes["open"]] == \
        ["out/numbers/a.json", "out/numbers/deeper/a.json"]


def _world(root: Path) -> list[StageOutput]:
    (root / "data").mkdir(parents=True)
    (root / "data" / "notes.jsonl").write_text(json.dumps({"note_id": "note-10042", "text": NOTE}) + "\n")
    (root / "out" / "by_note" / "note-10042").mkdir(parents=True)
    (root / "out" / "by_note" / "note-10042" / "scores.json").write_text('{"margin": 1.5}\n')
    (root / "out" / "summary.json").write_text('{"median_margin": 6.02, "notes": 1}\n')
    return [StageOutput("notes", "data/notes.jsonl", True, True), StageOutput("s", "out/summary.json", True, True),
            StageOutput("b", "out/by_note", True, True)]


def test_the_shareable_check_reads_file_text_and_file_names(tmp_path):
    outputs = _world(tmp_path)
    report = check_shareable(_params(), tmp_path, outputs)
    # the per-note directory is named by a note id: its manifest on a remote would name the note
    assert [(f.path.relative_to(tmp_path).as_posix(), f.where, f.kind) for f in report.findings] == [
        ("out/by_note/note-10042/scores.json", "file name", IDENTIFIER)]
    (tmp_path / "out" / "summary.json").write_text(json.dumps({"example": NOTE[20:120]}) + "\n")
    kinds = {(f.path.name, f.kind) for f in check_shareable(_params(), tmp_path, outputs).findings}
    assert ("summary.json", NOTE_TEXT) in kinds
    clean = check_shareable(_params(shareable_outputs=["out/nothing.json"]), tmp_path, outputs)
    assert clean.findings == [] and "0 listed" in clean.notes[-1]


def test_a_listed_output_missing_from_the_workspace_is_a_finding(tmp_path):
    outputs = _world(tmp_path)
    (tmp_path / "out" / "summary.json").unlink()
    findings = check_shareable(_params(shareable_outputs=["out/summary.json"]), tmp_path, outputs).findings
    assert [f.kind for f in findings] == ["absent from the workspace, cannot be checked"]


# ---- a real DVC project with two local remotes ------------------------------------------------------


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _in_remote(remote: Path, path: Path) -> bool:
    digest = _md5(path)
    return (remote / "files" / "md5" / digest[:2] / digest[2:]).is_file()


@pytest.fixture
def dvc_project(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    outputs = _world(root)
    del outputs
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "GIT_"))}
    env.update(HOME=str(tmp_path), DVC_NO_ANALYTICS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")

    def run(*args, check=True):
        done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
        assert not check or done.returncode == 0, done.stdout + done.stderr
        return done

    run("git", "init", "-q")
    run(sys.executable, "-m", "dvc", "init", "-q")
    for name in ("vault", "open"):
        run(sys.executable, "-m", "dvc", "remote", "add", name, str(tmp_path / name))
    run(sys.executable, "-m", "dvc", "add", "-q", "data/notes.jsonl", "out/summary.json")
    return root, run


def _write_params(root: Path, **remotes) -> None:
    params = _params(**remotes)
    params.pop("profile")
    (root / "params.yaml").write_text(yaml.safe_dump({"t": {"name": "t", **params}}) + "profile: t\n")


def test_publish_sends_text_to_the_private_remote_and_numbers_to_the_shareable_one(dvc_project, tmp_path):
    root, run = dvc_project
    _write_params(root, shareable_outputs=["out/summary.json"])
    done = run(sys.executable, "-m", "mistill.cli", "repro", "publish")
    assert "vault            private   data/notes.jsonl" in done.stdout
    assert "open             shareable out/summary.json" in done.stdout
    notes, summary = root / "data" / "notes.jsonl", root / "out" / "summary.json"
    assert _in_remote(tmp_path / "vault", notes) and not _in_remote(tmp_path / "vault", summary)
    assert _in_remote(tmp_path / "open", summary) and not _in_remote(tmp_path / "open", notes)


def test_publish_refuses_to_push_anything_when_a_shareable_output_holds_note_text(dvc_project, tmp_path):
    root, run = dvc_project
    _write_params(root, shareable_outputs=["out/summary.json", "data/notes.jsonl"])
    done = run(sys.executable, "-m", "mistill.cli", "repro", "publish", check=False)
    assert done.returncode == 2
    assert "data/notes.jsonl: line 1: note text" in done.stderr and "nothing pushed" in done.stderr
    assert not (tmp_path / "vault").exists() and not (tmp_path / "open").exists()
    # the same check, alone
    privacy = run(sys.executable, "-m", "mistill.cli", "repro", "privacy", "--shareable", check=False)
    assert privacy.returncode == 1 and "data/notes.jsonl: line 1: note text" in privacy.stderr


def test_publish_names_a_remote_that_is_not_configured(dvc_project):
    root, run = dvc_project
    _write_params(root, shareable="elsewhere")
    done = run(sys.executable, "-m", "mistill.cli", "repro", "publish", "--dry-run", check=False)
    assert done.returncode == 2 and "DVC remote 'elsewhere'" in done.stderr and "dvc remote add elsewhere" in done.stderr
