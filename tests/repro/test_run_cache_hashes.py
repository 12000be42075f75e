"""The run cache fed the hashes a stage has just saved (mistill.repro.run_cache_hashes): the same run-cache entry
and lock as DVC's own, each dependency hashed once after the run instead of again for every check."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
from dvc.output import Output
from dvc.repo import Repo
from dvc.stage.cache import StageCache

from mistill.repro import run_cache_hashes

PIPELINE = """\
stages:
  count:
    cmd: python -c "import os; open('out.txt', 'w').write(str(len(os.listdir('inputs'))))"
    deps:
      - inputs
      - params.yaml
    params:
      - size
    outs:
      - out.txt
"""


def _project(root: Path) -> Path:
    (root / "inputs").mkdir(parents=True)
    for i in range(5):
        (root / "inputs" / f"{i}.txt").write_text(str(i))
    (root / "params.yaml").write_text("size: 5\n")
    (root / "dvc.yaml").write_text(PIPELINE)
    Repo.init(str(root), no_scm=True)
    return root


def _run(root: Path, monkeypatch) -> tuple[dict[str, str], str, list[str]]:
    """Reproduce the project; its run-cache files, its lock and the paths hashed after the command ran."""
    hashed, ran = [], []
    dvc_build = Output._build

    def counting(self, *args, **kwargs):
        if ran:
            hashed.append(Path(self.fs_path).name)
        return dvc_build(self, *args, **kwargs)

    monkeypatch.setattr(Output, "_build", counting)
    monkeypatch.chdir(root)
    with Repo(str(root)) as repo:
        from dvc.stage import run as stage_run

        dvc_cmd_run = stage_run.cmd_run

        def marking(*args, **kwargs):
            result = dvc_cmd_run(*args, **kwargs)
            ran.append(True)
            return result

        monkeypatch.setattr(stage_run, "cmd_run", marking)
        repo.reproduce("count")
    runs = root / ".dvc" / "cache" / "runs"
    entries = {p.relative_to(runs).as_posix(): p.read_text() for p in runs.rglob("*") if p.is_file()}
    return entries, (root / "dvc.lock").read_text(), hashed


@pytest.fixture
def plain_stage_cache(monkeypatch):
    monkeypatch.setattr(StageCache, "save", run_cache_hashes.DVC_STAGE_CACHE_SAVE)


def test_the_run_cache_entry_and_lock_are_dvc_s_with_each_dependency_hashed_once(tmp_path, monkeypatch,
                                                                                 plain_stage_cache):
    plain = _run(_project(tmp_path / "plain"), monkeypatch)
    run_cache_hashes.install()
    patched = _run(_project(tmp_path / "patched"), monkeypatch)
    assert plain[0] and patched[0] == plain[0]          # the same run-cache entry, under the same key
    assert patched[1] == plain[1]                       # the same lock
    # DVC 3.x: save_deps, then the run cache's checks, each hashing anew (11 walks of `inputs` here); the
    # patched save: save_deps alone
    assert plain[2].count("inputs") >= 3 and patched[2].count("inputs") == 1


@contextmanager
def _saved_stage(root: Path, monkeypatch):
    """The project's stage with its dependencies saved (as `Stage.save` leaves them), and its `inputs`."""
    monkeypatch.chdir(root)
    with Repo(str(root)) as repo:
        stage = repo.stage.collect("count")[0]
        stage.save_deps()
        yield stage, next(d for d in stage.deps if Path(d.fs_path).name == "inputs")


def test_the_dependencies_answer_with_their_own_method_again_afterwards(tmp_path, monkeypatch, plain_stage_cache):
    root = _project(tmp_path / "p")
    with _saved_stage(root, monkeypatch) as (stage, dep):
        saved = dep.hash_info
        (root / "inputs" / "9.txt").write_text("new")
        with run_cache_hashes.saved_hashes(stage.deps):
            assert dep.get_hash() == saved              # inside: the saved hash
        assert "get_hash" not in vars(dep)
        assert dep.get_hash() != saved                  # after: hashed anew, the new file counted


def test_a_missing_dependency_keeps_dvc_s_answer(tmp_path, monkeypatch, plain_stage_cache):
    root = _project(tmp_path / "p")
    with _saved_stage(root, monkeypatch) as (stage, dep):
        shutil.rmtree(root / "inputs")
        with run_cache_hashes.saved_hashes(stage.deps):
            assert "get_hash" not in vars(dep)


def test_installed_it_is_what_stage_save_calls(monkeypatch, plain_stage_cache):
    run_cache_hashes.install()
    assert StageCache.save is run_cache_hashes.save
