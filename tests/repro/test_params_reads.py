"""One parse per version of a params file (mistill.repro.params_reads): what DVC's own read gives, copies that
do not leak into each other, and a fresh parse once the file changes."""

from __future__ import annotations

import os

from dvc.dependency import param
from dvc.repo import Repo
from dvc_objects.fs.local import LocalFileSystem

from mistill.repro import params_reads
from tests.repro.repro_helpers import REPO


def test_a_cached_read_is_dvc_s_read_parsed_once_and_copied(monkeypatch):
    calls = []
    dvc_load_path = params_reads.DVC_LOAD_PATH

    def counting(path, fs, **kwargs):
        calls.append(path)
        return dvc_load_path(path, fs, **kwargs)

    monkeypatch.setattr(params_reads, "DVC_LOAD_PATH", counting)
    monkeypatch.setattr(params_reads, "_parsed", {})
    fs = Repo(str(REPO)).fs
    path = str(REPO / "params.yaml")
    first = params_reads.cached_load(path, fs)
    assert first == dvc_load_path(path, fs) and first["demo"]["name"] == "demo"
    first["demo"]["name"] = "changed by a caller"
    assert params_reads.cached_load(path, fs)["demo"]["name"] == "demo"
    assert len(calls) == 1


def test_an_edited_file_is_parsed_again(tmp_path, monkeypatch):
    monkeypatch.setattr(params_reads, "_parsed", {})
    fs = LocalFileSystem()
    path = tmp_path / "params.yaml"
    path.write_text("size: 3\n")
    assert params_reads.cached_load(str(path), fs) == {"size": 3}
    path.write_text("size: 4\n")          # the same length: the modification time tells the versions apart
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert params_reads.cached_load(str(path), fs) == {"size": 4}


def test_installed_it_is_what_dvc_s_params_checks_call(monkeypatch):
    monkeypatch.setattr(param, "load_path", param.load_path)   # restored after the test
    params_reads.install()
    assert param.load_path is params_reads.cached_load
