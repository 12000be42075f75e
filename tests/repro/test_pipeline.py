"""The pipeline's files: the root dvc.yaml and the family files under pipelines/ make one graph whose
stages run in the repository root, are named once, and keep their lock entries beside their file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mistill.errors import UserError
from mistill.repro.pipeline import ROOT_PIPELINE, lock_files, pipeline_files, stage_addresses, stage_name
from tests.repro.repro_helpers import REPO


def _stages_by_file() -> dict[str, list]:
    from dvc.repo import Repo

    files = {p.as_posix() for p in pipeline_files(REPO)}
    by_file: dict[str, list] = {f: [] for f in files}
    with Repo(str(REPO)) as repo:
        for stage in repo.index.stages:
            path = Path(stage.path).relative_to(REPO).as_posix()
            if path in files:
                by_file[path].append(stage)
    return by_file


@pytest.fixture(scope="module")
def stages_by_file():
    return _stages_by_file()


def test_the_pipeline_is_the_root_file_and_three_family_files():
    assert [p.as_posix() for p in pipeline_files(REPO)] == [
        "dvc.yaml", "pipelines/distill/dvc.yaml", "pipelines/evaluate/dvc.yaml", "pipelines/own-heads/dvc.yaml"]
    assert [p.as_posix() for p in lock_files(REPO)][1] == "pipelines/distill/dvc.lock"


def test_every_stage_runs_in_the_repository_root(stages_by_file):
    """A family file's stages declare wdir ../..: their commands, deps and outs read as the root's do."""
    for stages in stages_by_file.values():
        for stage in stages:
            assert Path(stage.wdir).resolve() == REPO.resolve(), stage.addressing


def test_stage_names_are_unique_across_files_and_the_readers_are_in_the_root(stages_by_file):
    """Stage times, the grid and the calibration name a stage by its name alone; `dvc repro R-D6` finds a
    reader only in the root file."""
    names = [s.name for stages in stages_by_file.values() for s in stages]
    assert len(names) == len(set(names))
    for path, stages in stages_by_file.items():
        readers = [s.name for s in stages if s.name.startswith("R-")]
        assert not readers or path == ROOT_PIPELINE, (path, readers)
    assert sum(len(s) for s in stages_by_file.values()) > 200


def test_each_lock_holds_only_its_own_files_stages(stages_by_file):
    """DVC never prunes the entry of a stage renamed or moved to another file; such an entry would only
    make every stage's lock rewrite slower."""
    for pipeline, lock in zip(pipeline_files(REPO), lock_files(REPO)):
        if not (REPO / lock).exists():
            continue
        entries = set(yaml.safe_load((REPO / lock).read_text())["stages"])
        defined = {s.name for s in stages_by_file[pipeline.as_posix()]}
        assert not entries - defined, (lock.as_posix(), sorted(entries - defined)[:5])


def test_a_family_stage_is_addressed_through_its_file():
    targets = stage_addresses(REPO, ["R-D6", "DT-000", "EV-vanilla@qwen-fp32-0", "EV-variant", "HD-S-untrained"])
    assert targets == {"R-D6": "R-D6", "DT-000": "pipelines/distill/dvc.yaml:DT-000",
                       "EV-vanilla@qwen-fp32-0": "pipelines/evaluate/dvc.yaml:EV-vanilla@qwen-fp32-0",
                       "EV-variant": "pipelines/evaluate/dvc.yaml:EV-variant", "HD-S-untrained": "HD-S-untrained"}
    assert {stage_name(t) for t in targets.values()} == set(targets)
    with pytest.raises(UserError, match="no stage DT-999 in dvc.yaml"):
        stage_addresses(REPO, ["DT-999"])


def _tracked_files() -> set[str]:
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return {p for p in listed.decode().split("\0") if p}


def _param(params: dict, dotted: str):
    value = params
    for key in dotted.split("."):
        value = value[key]
    return value


def _lock_drift(lock: dict, tracked: set[str], params: dict) -> list[str]:
    """What a lock records that today's tracked files and params no longer say: each would make DVC
    rerun the stage in a checkout that holds the artifacts. Files are compared by md5 as DVC hashes
    them (directories, whose `.dir` hash needs their contents, and untracked artifacts are left to
    `dvc status`)."""
    from mistill.repro.stale_outputs import current_code

    drift = []
    for name, entry in lock["stages"].items():
        for dep in entry.get("deps", []):
            path, md5 = dep["path"], dep.get("md5", "")
            if path in tracked and not md5.endswith(".dir"):
                if current_code([path], REPO)[path] != md5:
                    drift.append(f"{name}: {path}")
        for file_params in entry.get("params", {}).values():
            for key, value in file_params.items():
                if _param(params, key) != value:
                    drift.append(f"{name}: params {key}")
    return drift


def test_the_committed_locks_record_today_s_code_and_params():
    """A checkout holding the artifacts reruns nothing: an edit of a stage's code or of a params section
    it reads must come with its lock entry, recomputed (or, where the outputs cannot change, `dvc commit`).
    The calibration's lock is not held to this: `calibrate apply` rewrites an input of its stage,
    results/expected/demo.yaml, right after each run."""
    tracked = _tracked_files()
    from mistill.params import FAST_SAFE_LOADER

    params = yaml.load((REPO / "params.yaml").read_text(), Loader=FAST_SAFE_LOADER)
    drift = []
    for lock_path in lock_files(REPO):
        lock = yaml.load((REPO / lock_path).read_text(), Loader=FAST_SAFE_LOADER)
        drift += _lock_drift(lock, tracked, params)
    assert drift == [], f"{len(drift)} stages would rerun beside their committed artifacts, e.g. {drift[:5]}"
