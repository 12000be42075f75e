"""The code version an artifact records: dirty for a changed source file, not for what the pipeline writes."""

from __future__ import annotations

import subprocess

from mistill.io import code_version, code_version_of


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def test_pipeline_outputs_do_not_make_the_tree_dirty(tmp_path, monkeypatch):
    for path, text in (("dvc.lock", "a\n"), ("pipelines/distill/dvc.yaml", "stages: {}\n"),
                       ("pipelines/distill/dvc.lock", "a\n"), ("results/R-C1.json", "{}\n"), ("src/x.py", "x = 1\n")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    monkeypatch.chdir(tmp_path)
    head = code_version()
    assert len(head) == 40 and "+" not in head
    (tmp_path / "dvc.lock").write_text("b\n")
    (tmp_path / "pipelines" / "distill" / "dvc.lock").write_text("b\n")
    (tmp_path / "results" / "R-C1.json").write_text('{"x": 1}\n')
    code_version_of.cache_clear()   # a process keeps its first answer; these edits stand for a new command
    assert code_version() == head
    (tmp_path / "src" / "x.py").write_text("x = 2\n")
    code_version_of.cache_clear()
    assert code_version() == head + "+dirty"


def test_one_answer_per_process(tmp_path, monkeypatch):
    """A command asks git once: an edit after its first answer is not seen until the process asks afresh."""
    (tmp_path / "a.py").write_text("a = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    monkeypatch.chdir(tmp_path)
    code_version_of.cache_clear()
    head = code_version()
    (tmp_path / "a.py").write_text("a = 2\n")
    assert code_version() == head
    code_version_of.cache_clear()
    assert code_version() == head + "+dirty"
