"""The lock update of `mistill.repro.lock_update` writes what DVC's own round trip writes: byte for byte for an
entry without repeated values, the same data for one with them, on every committed lock and in a real
`dvc repro`."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dvc.utils.serialize._yaml import _dump, parse_yaml_for_update

from mistill.repro.lock_update import updated_lines
from mistill.repro.pipeline import lock_files
from tests.repro.repro_helpers import REPO


def _dvc_update(text: str, stage_data: dict) -> str:
    """What `dvc.dvcfile.Lockfile.dump_stages` writes: the whole lock through ruamel's round trip."""
    data = parse_yaml_for_update(text, "dvc.lock")
    data["stages"].update(stage_data)
    out = io.StringIO()
    _dump(data, out)
    return out.getvalue()


def _changed(entry: dict) -> dict:
    """The entry as a rerun with another first dependency would record it."""
    entry = yaml.safe_load(yaml.safe_dump(entry))
    first = (entry.get("deps") or entry["outs"])[0]
    first["md5"] = "0" * 32
    return entry


@pytest.mark.parametrize("lock", [p.as_posix() for p in lock_files(REPO)])
def test_an_entry_rewritten_in_place_and_a_new_one_appended_as_dvc_writes_them(lock):
    text = (REPO / lock).read_text()
    stages = yaml.load(text, Loader=yaml.CSafeLoader)["stages"]
    names = list(stages)
    for name in (names[0], names[-1]):   # an entry recorded again as it was: the lock is unchanged
        assert updated_lines(text.splitlines(keepends=True), {name: stages[name]}) == (text.splitlines(True), False)
    middle = {names[len(names) // 2]: _changed(stages[names[len(names) // 2]])}
    mine, changed = updated_lines(text.splitlines(keepends=True), middle)
    assert changed and "".join(mine) == _dvc_update(text, middle)
    new = {"a-new-stage@item": _changed(stages[names[0]])}
    mine, changed = updated_lines(text.splitlines(keepends=True), new)
    assert changed and "".join(mine) == _dvc_update(text, new)


def test_an_entry_with_repeated_values_is_written_out_in_full_and_reads_the_same():
    """R-D30's params repeat three variant entries (a YAML alias in params.yaml): the round trip writes anchors,
    the update writes the values again; both read back as the same lock."""
    text = (REPO / "dvc.lock").read_text()
    stages = yaml.load(text, Loader=yaml.CSafeLoader)["stages"]
    stage_data = {"R-D30": _changed(stages["R-D30"])}
    params = stage_data["R-D30"]["params"]["params.yaml"]
    params["profile.variants.own_traces"] = {k: params[f"profile.variants.arms.{k}"] for k in
                                             params["profile.variants.own_traces"]}   # shared objects, as DVC's are
    mine, _ = updated_lines(text.splitlines(keepends=True), stage_data)
    assert "&id" in _dvc_update(text, stage_data).split("  R-D30:\n")[1].split("\n  R-")[0]
    assert yaml.safe_load("".join(mine)) == yaml.safe_load(_dvc_update(text, stage_data))


def _project(root: Path) -> None:
    root.mkdir()
    (root / "params.yaml").write_text("size: 3\nname: first\n")
    (root / "data.txt").write_text("seed\n")
    (root / "dvc.yaml").write_text(
        "stages:\n"
        "  copy:\n"
        "    cmd: cp data.txt copied.txt\n"
        "    deps: [data.txt]\n"
        "    outs: [copied.txt]\n"
        "  count:\n"
        "    foreach: [a, b]\n"
        "    do:\n"
        "      cmd: echo ${item} >> copied-${item}.txt && wc -c copied.txt > count-${item}.txt\n"
        "      deps: [copied.txt]\n"
        "      params: [size]\n"
        "      outs: ['count-${item}.txt', 'copied-${item}.txt']\n"
        "  named:\n"
        "    cmd: echo done > named.txt\n"
        "    deps: [count-a.txt]\n"
        "    params: [name]\n"
        "    outs: [named.txt]\n")
    for args in (["git", "init", "-q"], ["dvc", "init", "-q"]):
        subprocess.run(args, cwd=root, check=True)


def _repro(root: Path, command: list[str]) -> str:
    result = subprocess.run([*command, "repro"], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return (root / "dvc.lock").read_text()


@pytest.mark.skipif(shutil.which("dvc") is None, reason="dvc is not on PATH")
def test_dvc_repro_with_the_update_writes_the_lock_plain_dvc_writes(tmp_path):
    """The same project reproduced by `dvc` and by `python -m mistill.repro.dvc_run` (the lock update and the
    params reads in place): a first lock, then a params edit that reruns two stages, then a new input that reruns
    all."""
    plain, fast = tmp_path / "plain", tmp_path / "fast"
    _project(plain)
    _project(fast)
    commands = {plain: ["dvc"], fast: [sys.executable, "-m", "mistill.repro.dvc_run"]}
    for edit in (None, ("params.yaml", "size: 4\nname: first\n"), ("data.txt", "another seed\n")):
        if edit:
            for root in commands:
                (root / edit[0]).write_text(edit[1])
        assert _repro(fast, commands[fast]) == _repro(plain, commands[plain])
    assert "count@b" in (fast / "dvc.lock").read_text()
