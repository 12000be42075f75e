import hashlib
import json

import numpy as np
import pytest

from mistill.errors import UserError
from mistill.repro.numbers import read_numbers, write_numbers

PARAMS = {"profile": "paper", "paths": {"results": "results"}, "seeds": {"corpus": 0}}


def _values(**kv):
    return {k: {"value": v, "statistic": "median over notes", "artifact": "artifacts/HD-001"} for k, v in kv.items()}


def test_write_then_read_round_trip(registry, tmp_path):
    artifact = tmp_path / "faithfulness.json"
    artifact.write_text('{"x": 1}')
    path = write_numbers("R-C3", _values(necessity_top8_p1=np.float64(0.61), knockin_top40_p1=0.86,
                                         notes_necessity_above_random_p1_p2=np.array([92, 100])),
                         reader="readers/r_c3.py", inputs=[artifact], params=PARAMS,
                         results_dir=tmp_path / "results", registry=registry)
    assert path == tmp_path / "results" / "R-C3.json"
    raw = json.loads(path.read_text())
    assert raw["id"] == "R-C3" and raw["profile"] == "paper" and raw["reader"] == "readers/r_c3.py"
    assert raw["inputs"] == {str(artifact): hashlib.sha256(b'{"x": 1}').hexdigest()}
    assert raw["values"]["notes_necessity_above_random_p1_p2"]["value"] == [92, 100]
    assert raw["code_version"] and len(raw["params_sha256"]) == 64
    record = read_numbers(path, registry)
    assert record.values["necessity_top8_p1"]["value"] == 0.61
    assert [p.name for p in path.parent.iterdir()] == ["R-C3.json"]       # no temp file left behind


def test_directory_inputs_hash_their_files(registry, tmp_path):
    d = tmp_path / "HD-001"
    (d / "n1").mkdir(parents=True)
    (d / "n1" / "events.jsonl").write_text("{}\n")
    path = write_numbers("R-C3", _values(knockin_top40_p1=0.9), reader="r", inputs=[d], params=PARAMS,
                         results_dir=tmp_path, registry=registry)
    first = json.loads(path.read_text())["inputs"][str(d)]
    (d / "n1" / "events.jsonl").write_text("{}\n{}\n")
    path = write_numbers("R-C3", _values(knockin_top40_p1=0.9), reader="r", inputs=[d], params=PARAMS,
                         results_dir=tmp_path, registry=registry)
    assert json.loads(path.read_text())["inputs"][str(d)] != first


@pytest.mark.parametrize("rid, values, message", [
    ("R-C99", _values(knockin_top40_p1=0.9), "unknown result id 'R-C99'"),
    ("R-C3", _values(knockin_top41_p1=0.9), "unknown value key 'knockin_top41_p1'"),
    ("R-C3", _values(knockin_top40_p1=float("nan")), "finite number"),
    ("R-C3", _values(knockin_top40_p1="0.9"), "finite number"),
    ("R-C3", {"knockin_top40_p1": {"value": 0.9}}, "missing statistic, artifact"),
])
def test_bad_values_raise_one_line_and_write_nothing(registry, tmp_path, rid, values, message):
    with pytest.raises(UserError) as err:
        write_numbers(rid, values, reader="r", inputs=[], params=PARAMS, results_dir=tmp_path, registry=registry)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_params_must_name_a_profile(registry, tmp_path):
    with pytest.raises(UserError, match="registered profile"):
        write_numbers("R-C3", _values(knockin_top40_p1=0.9), reader="r", inputs=[], params={"paths": {}},
                      results_dir=tmp_path, registry=registry)


def test_missing_input_is_a_user_error(registry, tmp_path):
    with pytest.raises(UserError, match="no such file"):
        write_numbers("R-C3", _values(knockin_top40_p1=0.9), reader="r", inputs=[tmp_path / "absent"],
                      params=PARAMS, results_dir=tmp_path / "out", registry=registry)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content, message", [
    ("{not json", "not JSON"),
    ('["R-C3"]', "expected a JSON object"),
    ('{"id": "R-C3", "profile": "paper"}', "missing reader, inputs, values, code_version"),
    (('{"id": "R-C3", "profile": "paper", "reader": "r", "inputs": {}, "code_version": "x", '
      '"values": {"k": {"value": [1, "a"], "statistic": "s", "artifact": "a"}}}'), "finite number"),
    ('{"id": "R-C77", "profile": "paper", "reader": "r", "inputs": {}, "code_version": "x", "values": {}}',
     "unknown result id"),
])
def test_malformed_numbers_file_is_one_clear_line(registry, tmp_path, content, message):
    path = tmp_path / "R-C3.json"
    path.write_text(content)
    with pytest.raises(UserError) as err:
        read_numbers(path, registry)
    assert message in str(err.value) and str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_a_key_the_reader_declares_is_written_until_blessed(registry, tmp_path):
    """A reader may write a key no profile records yet when its `keys(params)` declares it (e.g. the head the
    demo names by its own rule); any other unknown key is still refused."""
    values = _values(knockin_top40_p1=0.9, l3h2_ic_p1=3.9)
    with pytest.raises(UserError, match="unknown value key 'l3h2_ic_p1'"):
        write_numbers("R-C3", values, reader="r", inputs=[], params=PARAMS, results_dir=tmp_path, registry=registry)
    path = write_numbers("R-C3", values, reader="r", inputs=[], params=PARAMS, results_dir=tmp_path,
                         registry=registry, declared_keys=["l3h2_ic_p1"])
    assert json.loads(path.read_text())["values"]["l3h2_ic_p1"]["value"] == 3.9
    assert read_numbers(path, registry).values["l3h2_ic_p1"]["value"] == 3.9   # readable by check and bless
