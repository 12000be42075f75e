"""A dependency's build kept until a stage writes under it (mistill.repro.dependency_hashes): the locks are DVC's
own, a directory two stages read is walked for the first only, and a stage that writes into it makes the next
reader walk it again."""

from __future__ import annotations

from pathlib import Path

import pytest
from dvc.output import Output
from dvc.repo import Repo
from dvc.stage import Stage

from mistill.repro import dependency_hashes

COUNT = "python -c \"import os; open('{out}', 'w').write(str(sorted(os.listdir('inputs'))))\""
TWO_READERS = f"""\
stages:
  first:
    cmd: {COUNT.format(out='first.txt')}
    deps: [inputs]
    outs: [first.txt]
  second:
    cmd: {COUNT.format(out='second.txt')}
    deps: [inputs, first.txt]
    outs: [second.txt]
"""
WRITER_FIRST = f"""\
stages:
  writer:
    cmd: python -c "open('inputs/written.txt', 'w').write('new')"
    outs: [inputs/written.txt]
  second:
    cmd: {COUNT.format(out='second.txt')}
    deps: [inputs]
    outs: [second.txt]
"""


def _project(root: Path, pipeline: str) -> Path:
    (root / "inputs").mkdir(parents=True)
    for i in range(5):
        (root / "inputs" / f"{i}.txt").write_text(str(i))
    (root / "dvc.yaml").write_text(pipeline)
    Repo.init(str(root), no_scm=True)
    return root


def _reproduce(root: Path, monkeypatch, *, kept: bool) -> tuple[str, str, int]:
    """Reproduce the project (DVC's builds kept or not); its lock, the second stage's output and how often
    `inputs` was walked."""
    walks = []
    dvc_build = dependency_hashes.DVC_BUILD

    def counting(output, odb, fs_path, *args, **kwargs):
        if Path(fs_path).name == "inputs":
            walks.append(fs_path)
        return dvc_build(output, odb, fs_path, *args, **kwargs)

    _restored_afterwards(monkeypatch)
    if kept:
        dependency_hashes.install()
        monkeypatch.setattr(dependency_hashes, "DVC_BUILD", counting)   # under the kept builds: real walks
    else:
        monkeypatch.setattr(Output, "_build", counting)
    monkeypatch.chdir(root)
    with Repo(str(root)) as repo:
        repo.reproduce()
    return (root / "dvc.lock").read_text(), (root / "second.txt").read_text(), len(walks)


def _restored_afterwards(monkeypatch) -> None:
    for cls, name in ((Output, "_build"), (Stage, "run"), (Stage, "checkout")):
        monkeypatch.setattr(cls, name, getattr(cls, name))


def test_two_readers_of_a_directory_walk_it_for_the_first_only(tmp_path, monkeypatch):
    plain = _reproduce(_project(tmp_path / "plain", TWO_READERS), monkeypatch, kept=False)
    monkeypatch.undo()
    kept = _reproduce(_project(tmp_path / "kept", TWO_READERS), monkeypatch, kept=True)
    assert kept[0] == plain[0] and kept[1] == plain[1]      # DVC's lock and outputs
    # DVC: each stage hashes `inputs` to record it and for every check of its run cache (10 walks a stage here,
    # a stage without a lock entry needs no hash to be run); kept: the first stage's record alone
    assert plain[2] == 20 and kept[2] == 1


def test_a_stage_that_writes_under_a_kept_directory_drops_its_build(tmp_path, monkeypatch):
    """`inputs` hashed (and kept) before the writer runs: the reader after it hashes it anew, and its lock
    records the written file, as DVC's own does."""
    plain = _reproduce(_project(tmp_path / "plain", WRITER_FIRST), monkeypatch, kept=False)
    monkeypatch.undo()
    root = _project(tmp_path / "kept", WRITER_FIRST)
    _restored_afterwards(monkeypatch)
    dependency_hashes.install()
    monkeypatch.chdir(root)
    with Repo(str(root)) as repo:
        reader = repo.stage.collect("second")[0]
        before = reader.deps[0].get_hash()                  # kept, without written.txt
        repo.reproduce()
    assert "written.txt" in (root / "second.txt").read_text()
    assert (root / "dvc.lock").read_text() == plain[0]
    assert before.value not in plain[0]                     # the kept build would have recorded another hash


@pytest.mark.parametrize("path, other, overlaps", [
    ("/r/a", "/r/a", True), ("/r/a/b", "/r/a", True), ("/r/a", "/r/a/b", True),
    ("/r/ab", "/r/a", False), ("/r/a", "/r/b", False),
])
def test_overlap_is_by_path_component(path, other, overlaps):
    assert dependency_hashes._overlaps(path, other) is overlaps


def test_installed_it_is_what_dvc_calls(monkeypatch):
    _restored_afterwards(monkeypatch)
    dependency_hashes.install()
    assert Output._build is dependency_hashes.build
    assert Stage.run is dependency_hashes.run and Stage.checkout is dependency_hashes.checkout
