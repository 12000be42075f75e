"""A family stage (mistill.repro.families): its items resolved as DVC resolves dvc.yaml, each rerun only when its
own commands, params or dependencies change, a failure resumed at the failing item, and the whole as one
`dvc repro` stage."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mistill.errors import UserError
from mistill.repro.families import family_items, run_family

FAMILIES = """\
vars:
  - ../../params.yaml
stages:
  copies:
    foreach: ${arms}
    do:
      wdir: ../..
      cmd:
        - echo ${key} >> runs.log
        - mkdir -p out/copies && cat data/${item.source} > out/copies/${key}.txt && echo ${item.size} >> out/copies/${key}.txt
      deps:
        - data/${item.source}
        - shared
      params:
        - arms.${key}
      outs:
        - out/copies/${key}.txt:
            persist: true
"""
PARAMS = "arms:\n  first: {source: a.txt, size: 1}\n  second: {source: b.txt, size: 2}\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pipelines" / "copies").mkdir(parents=True)
    (tmp_path / "pipelines" / "copies" / "families.yaml").write_text(FAMILIES)
    (tmp_path / "params.yaml").write_text(PARAMS)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("A\n")
    (tmp_path / "data" / "b.txt").write_text("B\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "notes.txt").write_text("shared\n")
    for args in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(args, cwd=tmp_path, check=True)
    return tmp_path


def _run(root: Path, **kwargs) -> list[str]:
    return run_family(root, "pipelines/copies/families.yaml", "copies", **kwargs)


def test_items_are_resolved_as_dvc_resolves_a_foreach_stage(project):
    first, second = family_items(project, "pipelines/copies/families.yaml", "copies")
    assert (first.name, second.name) == ("copies@first", "copies@second")
    assert first.commands[1].endswith("cat data/a.txt > out/copies/first.txt && echo 1 >> out/copies/first.txt")
    assert first.deps == ("data/a.txt", "shared") and first.params == ("arms.first",)
    assert first.outs == (("out/copies/first.txt", True),) and first.wdir == "."
    assert first.key_file == Path("out/copies/.first.txt.family-key")


def test_an_item_reruns_when_its_own_inputs_change_and_only_then(project):
    assert _run(project) == ["copies@first", "copies@second"]
    assert (project / "out" / "copies" / "second.txt").read_text() == "B\n2\n"
    assert _run(project) == []                                   # everything up to date
    (project / "params.yaml").write_text(PARAMS.replace("size: 2", "size: 5"))
    assert _run(project) == ["copies@second"]                    # its params
    (project / "data" / "a.txt").write_text("A again\n")
    assert _run(project) == ["copies@first"]                     # its own dependency
    (project / "shared" / ".notes.txt.1234.tmp").write_text("an atomic write's leftover")
    assert _run(project) == []                                   # DVC ignores those too
    (project / "shared" / "notes.txt").write_text("changed\n")
    assert _run(project) == ["copies@first", "copies@second"]    # a dependency they share
    assert (project / "runs.log").read_text().split() == ["first", "second", "second", "first", "first", "second"]


def test_a_failing_item_stops_the_family_and_the_next_run_starts_with_it(project):
    (project / "data" / "b.txt").unlink()
    (project / "pipelines" / "copies" / "families.yaml").write_text(FAMILIES.replace("        - data/${item.source}\n", ""))
    with pytest.raises(UserError, match="copies@second"):
        _run(project)
    (project / "data" / "b.txt").write_text("B\n")
    assert _run(project) == ["copies@second"]


def test_dry_lists_without_running_and_a_missing_dependency_or_family_is_named(project):
    assert _run(project, dry=True) == ["copies@first", "copies@second"]
    assert not (project / "runs.log").exists()
    assert _run(project, only=["copies@second"]) == ["copies@second"]
    with pytest.raises(UserError, match="no item copies@third"):
        _run(project, only=["copies@third"])
    with pytest.raises(UserError, match="no family 'others'"):
        run_family(project, "pipelines/copies/families.yaml", "others")
    (project / "data" / "a.txt").unlink()
    with pytest.raises(UserError, match="data/a.txt: a dependency that does not exist"):
        _run(project)


@pytest.mark.skipif(shutil.which("dvc", path=str(Path(sys.executable).parent)) is None, reason="no dvc")
def test_dvc_runs_the_family_as_one_stage_and_times_each_item(project):
    (project / "dvc.yaml").write_text(
        "stages:\n"
        "  copies:\n"
        "    cmd: mistill repro family pipelines/copies/families.yaml copies\n"
        "    deps: [data, shared, pipelines/copies/families.yaml]\n"
        "    params: [arms]\n"
        "    outs:\n"
        "      - out/copies:\n"
        "          persist: true\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "mistill.repro.dvc_run", "repro"], cwd=project, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "Running family item 'copies@first'" in done.stdout
    status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=project, env=env, capture_output=True,
                            text=True)
    assert "up to date" in status.stdout


def test_an_item_s_outputs_are_removed_before_it_reruns_unless_persistent(project):
    """As DVC does for a stage: a rerun starts from no output, except where the output is declared persistent."""
    for persist, kept in ((False, ["2"]), (True, ["1", "2"])):
        text = FAMILIES.replace("out/copies/${key}.txt:\n            persist: true",
                                f"out/{persist}/${{key}}:\n            persist: {str(persist).lower()}")
        text = text.replace("mkdir -p out/copies && cat data/${item.source} > out/copies/${key}.txt && "
                            "echo ${item.size} >> out/copies/${key}.txt",
                            f"mkdir -p out/{persist}/${{key}} && touch out/{persist}/${{key}}/${{item.size}}")
        (project / "pipelines" / "copies" / "families.yaml").write_text(text)
        (project / "params.yaml").write_text(PARAMS.replace("size: 2", "size: 1"))
        _run(project, only=["copies@second"])
        (project / "params.yaml").write_text(PARAMS)
        assert _run(project, only=["copies@second"]) == ["copies@second"]
        assert sorted(p.name for p in (project / "out" / str(persist) / "second").iterdir()) == kept


SIDE_BY_SIDE = "profile: {compute: {family_jobs: 2}}\n"


def test_items_run_side_by_side_and_compute_what_they_compute_alone(project):
    """compute.family_jobs 2: two items at a time (each waits until the other has started, which one after the
    other never happens), each with its output in its own log; how many run at a time is not part of what an
    item computes, so going back to one at a time reruns nothing."""
    wait_for_other = ("touch started.${key} && for i in $(seq 100); do "
                      "[ $(ls started.* | wc -l) -ge 2 ] && break; sleep 0.05; done && "
                      "[ $(ls started.* | wc -l) -ge 2 ] && echo ${key} >> runs.log")
    text = FAMILIES.replace("echo ${key} >> runs.log", wait_for_other)
    (project / "pipelines" / "copies" / "families.yaml").write_text(text)
    (project / "params.yaml").write_text(PARAMS + SIDE_BY_SIDE)
    assert _run(project) == ["copies@first", "copies@second"]
    assert sorted((project / "runs.log").read_text().split()) == ["first", "second"]
    log = (project / ".dvc" / "tmp" / "mistill" / "families" / "copies@first.log").read_text().splitlines()
    assert log[0].startswith("> touch started.first") and log[1].startswith("> mkdir")   # every command's
    (project / "params.yaml").write_text(PARAMS)
    assert _run(project) == []


def test_side_by_side_a_failure_lets_the_running_item_finish_and_starts_no_other(project):
    (project / "data" / "c.txt").write_text("C\n")
    params = PARAMS + "  third: {source: c.txt, size: 3}\n" + SIDE_BY_SIDE
    (project / "params.yaml").write_text(params)
    text = FAMILIES.replace("echo ${key} >> runs.log", "echo ${key} >> runs.log && (test -e ok || test ${key} != first)")
    (project / "pipelines" / "copies" / "families.yaml").write_text(text)
    with pytest.raises(UserError, match=r"copies@first: .* \(its output: .*copies@first.log\)"):
        _run(project)
    assert sorted((project / "runs.log").read_text().split()) == ["first", "second"]    # third never started
    (project / "ok").write_text("")                                                    # not an input: no key moves
    assert _run(project) == ["copies@first", "copies@third"]                           # second's key was recorded
