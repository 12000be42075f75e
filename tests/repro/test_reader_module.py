"""A reader loads from its file as a fresh module, outside sys.modules."""

import sys

import pytest

from mistill.errors import UserError
from mistill.repro.reader_module import load_reader


def test_a_reader_loads_from_its_file_and_each_load_is_fresh(tmp_path):
    path = tmp_path / "r_x1.py"
    path.write_text("CALLS = []\ndef compute_values(params):\n    CALLS.append(params)\n    return {'k': 1}, {}\n")
    first, second = load_reader(path), load_reader(path)
    assert first.compute_values({"a": 1}) == ({"k": 1}, {})
    assert first.CALLS == [{"a": 1}] and second.CALLS == []          # two modules, not one shared
    assert "mistill_reader_r_x1" not in sys.modules
    with pytest.raises(UserError, match="no reader at"):
        load_reader(tmp_path / "r_missing.py")
