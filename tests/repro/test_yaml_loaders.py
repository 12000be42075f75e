"""DVC reads params.yaml, dvc.yaml and dvc.lock with ruamel's safe loader, which is libyaml's C parser when
ruamel.yaml.clib is installed (a pinned dependency: it parses the 1.4 MB lock about four times faster than
pure Python). The two parsers must read every pipeline file alike, or DVC would record other param values
and mark stages stale."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from mistill.repro.pipeline import lock_files, pipeline_files
from tests.repro.repro_helpers import REPO

PIPELINE_FILES = ["params.yaml", *(p.as_posix() for p in (*pipeline_files(REPO), *lock_files(REPO))),
                  "calibration/dvc.yaml", "calibration/dvc.lock"]


def test_the_c_parser_is_what_dvc_gets():
    assert YAML(typ="safe").Parser.__name__ == "CParser"


@pytest.mark.parametrize("name", PIPELINE_FILES)
def test_c_and_pure_python_parsers_read_each_pipeline_file_alike(name):
    text = (REPO / name).read_text()
    assert YAML(typ="safe").load(text) == YAML(typ="safe", pure=True).load(text)


def test_the_stages_read_params_with_libyaml_and_get_what_safe_load_gives():
    """`mistill.params` parses with PyYAML's libyaml loader (the stages read params.yaml several times each)."""
    import yaml

    from mistill.params import FAST_SAFE_LOADER, load_all

    assert FAST_SAFE_LOADER is yaml.CSafeLoader
    assert load_all(REPO / "params.yaml") == yaml.safe_load((REPO / "params.yaml").read_text())
