"""A persisted output is never reused by other code than made it (mistill.repro.stale_outputs)."""

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from mistill.repro.stale_outputs import MARKERS, clear_outputs_of_other_code, lock_entry


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _stage(tmp_path: Path, code: str, recorded: str, lock_dir: str = ".") -> Path:
    """A repo whose stage `S` recorded `src/pass.py` with the text `recorded` and whose file holds `code`;
    its outputs, a directory and a file, are there."""
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "pass.py").write_text(code)
    (tmp_path / "out" / "n1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "out" / "n1" / "done.json").write_text("{}")
    (tmp_path / "rows.jsonl").write_text('{"note_id": "n1"}\n')
    lock = {"schema": "2.0", "stages": {
        "other": {"cmd": "x", "deps": [{"path": "src/pass.py", "hash": "md5", "md5": _md5(code)}]},
        "S@a": {"cmd": "mistill pass", "deps": [
            {"path": "src/pass.py", "hash": "md5", "md5": _md5(recorded), "size": 1},
            {"path": "src", "hash": "md5", "md5": "0" * 32 + ".dir"},          # a directory is not a file's code
            {"path": "data.jsonl", "hash": "md5", "md5": "1" * 32}],
            "outs": [{"path": "out", "hash": "md5", "md5": "2" * 32 + ".dir"},
                     {"path": "rows.jsonl", "hash": "md5", "md5": "3" * 32}]}}}
    (tmp_path / lock_dir).mkdir(parents=True, exist_ok=True)
    (tmp_path / lock_dir / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    return tmp_path


def test_lock_entry_reads_one_stage_of_the_lock_by_its_name():
    text = textwrap.dedent("""\
        schema: '2.0'
        stages:
          A:
            cmd: a
            deps:
            - path: src/a.py
              md5: aa
          'B@x-1':
            cmd: b
          C:
            cmd: c
        """)
    assert lock_entry(text, "A") == {"cmd": "a", "deps": [{"path": "src/a.py", "md5": "aa"}]}
    assert lock_entry(text, "B@x-1") == {"cmd": "b"}
    assert lock_entry(text, "C") == {"cmd": "c"}
    assert lock_entry(text, "D") is None


def test_outputs_of_the_recorded_code_are_kept(tmp_path):
    repo = _stage(tmp_path, code="v1", recorded="v1")
    assert clear_outputs_of_other_code("S@a", repo, repo) == []
    assert (repo / "out" / "n1" / "done.json").exists() and (repo / "rows.jsonl").exists()
    assert not (repo / MARKERS).exists()


def test_outputs_of_other_code_are_removed_and_a_killed_rerun_under_the_new_code_resumes(tmp_path):
    repo = _stage(tmp_path, code="v2", recorded="v1")
    assert clear_outputs_of_other_code("S@a", repo, repo) == ["out", "rows.jsonl"]
    assert not (repo / "out").exists() and not (repo / "rows.jsonl").exists()

    (repo / "rows.jsonl").write_text('{"note_id": "n1"}\n')       # the new code's work, then a kill
    assert clear_outputs_of_other_code("S@a", repo, repo) == []     # same code again: resumed
    assert (repo / "rows.jsonl").exists()

    (repo / "src" / "pass.py").write_text("v3")                   # edited again before the rerun
    assert clear_outputs_of_other_code("S@a", repo, repo) == ["rows.jsonl"]


def test_a_killed_run_under_other_code_is_not_taken_for_the_lock_s(tmp_path):
    repo = _stage(tmp_path, code="v2", recorded="v1")
    clear_outputs_of_other_code("S@a", repo, repo)
    (repo / "rows.jsonl").write_text('{"note_id": "n1"}\n')       # v2's partial work, killed
    (repo / "src" / "pass.py").write_text("v1")                   # back to the code the lock records
    assert clear_outputs_of_other_code("S@a", repo, repo) == ["rows.jsonl"]
    assert clear_outputs_of_other_code("S@a", repo, repo) == []     # the lock's code once more: kept
    assert list((repo / MARKERS).iterdir()) == []                   # its marker is gone with it


def test_a_finished_run_s_marker_gives_way_to_the_lock(tmp_path):
    repo = _stage(tmp_path, code="v2", recorded="v1")
    clear_outputs_of_other_code("S@a", repo, repo)
    _stage(tmp_path, code="v2", recorded="v2")                    # DVC recorded the finished run
    assert clear_outputs_of_other_code("S@a", repo, repo) == []
    assert list((repo / MARKERS).iterdir()) == []


def test_a_family_file_s_stage_is_found_in_its_own_lock(tmp_path):
    repo = _stage(tmp_path, code="v2", recorded="v1", lock_dir="pipelines/p")
    assert clear_outputs_of_other_code("pipelines/p/dvc.yaml:S@a", repo, repo) == ["out", "rows.jsonl"]


def test_a_stage_never_recorded_is_left_alone(tmp_path):
    repo = _stage(tmp_path, code="v2", recorded="v1")
    assert clear_outputs_of_other_code("T", repo, repo) == []
    assert clear_outputs_of_other_code("pipelines/none/dvc.yaml:S@a", repo, repo) == []
    assert (repo / "rows.jsonl").exists()


TOOL = """\
import pathlib
import sys

from mistill.repro.stale_outputs import guard_stage

guard_stage()
out = pathlib.Path("artifacts/out.txt")
if not out.exists():                       # a resumable pass: what is there is kept
    out.parent.mkdir(exist_ok=True)
    out.write_text(pathlib.Path("src/pass.py").read_text())
"""


def test_dvc_repro_after_a_code_edit_recomputes_a_persisted_output(tmp_path):
    """The whole rule under DVC itself: its stage address for a family file, its lock, `persist`."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "pass.py").write_text("v1\n")
    (tmp_path / "tool.py").write_text(TOOL)
    (tmp_path / "pipelines" / "p").mkdir(parents=True)
    (tmp_path / "pipelines" / "p" / "dvc.yaml").write_text(textwrap.dedent(f"""\
        stages:
          S:
            wdir: ../..
            cmd: {sys.executable} tool.py
            deps: [src/pass.py, tool.py]
            outs:
              - artifacts/out.txt:
                  persist: true
        """))
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1"}
    for var in ("DVC_STAGE", "DVC_ROOT"):
        env.pop(var, None)

    def dvc(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "dvc", *args], cwd=tmp_path, env=env, check=True,
                       capture_output=True)

    dvc("init", "--no-scm", "-q")
    dvc("repro", "pipelines/p/dvc.yaml")
    assert (tmp_path / "artifacts" / "out.txt").read_text() == "v1\n"
    (tmp_path / "src" / "pass.py").write_text("v2\n")
    dvc("repro", "pipelines/p/dvc.yaml")
    assert (tmp_path / "artifacts" / "out.txt").read_text() == "v2\n"   # without the rule: "v1\n", reused
