"""The paper profile's loader on a small file in the format of Edin et al. (2023)'s release."""

from __future__ import annotations

import pandas as pd
import pytest

from mistill.errors import UserError
from mistill.world.inventory import shared_order
from mistill.world.mimic import mimiciv_inventory, mimiciv_notes

pytest.importorskip("pyarrow")


def _release(tmp_path, diag=None):
    frame = pd.DataFrame({
        "subject_id": [10001, 10001, 10002],
        "_id": [20001, 20002, 20003],
        "note_id": ["10001-DS-1", "10001-DS-2", "10002-DS-1"],
        "text": ["chronic kidney disease", "type 2 diabetes and ckd", "essential hypertension"],
        "icd10_diag": diag or [["N189", "E119"], ["E11.9", "N18.9", "N189"], ["I10"]],
        "icd10_proc": [["0DJ08ZZ"], [], []],
    })
    frame["target"] = frame["icd10_proc"] + frame["icd10_diag"]
    table = tmp_path / "mimiciv_icd10.feather"
    frame.to_feather(table)
    splits = tmp_path / "mimiciv_icd10_split.feather"
    pd.DataFrame({"_id": [20001, 20002, 20003], "split": ["test", "test", "train"]}).to_feather(splits)
    return table, splits


def test_inventory_from_the_release_is_dotted_and_described(tmp_path):
    table, _ = _release(tmp_path)
    inventory = mimiciv_inventory(table, seed=0)
    assert sorted(inventory.codes) == ["E11.9", "I10", "N18.9"]           # diagnoses only, normalised
    assert inventory["N18.9"].description == "chronic kidney disease unspecified"
    assert inventory.codes == tuple(c.code for c in shared_order(list(inventory), 0))


def test_notes_from_the_release(tmp_path):
    table, splits = _release(tmp_path)
    notes = mimiciv_notes(table, splits)
    assert [(n.note_id, n.patient_id, n.split) for n in notes] == [
        ("20001", "10001", "test"), ("20002", "10001", "test"), ("20003", "10002", "train")]
    assert notes[1].gold_codes == ("E11.9", "N18.9")                       # de-duplicated, in order
    assert notes[0].meta == {"source_split": "test"}


def test_parquet_and_csv_exports(tmp_path):
    table, splits = _release(tmp_path)
    frame = pd.read_feather(table)
    frame.to_parquet(tmp_path / "release.parquet")
    assert sorted(mimiciv_inventory(tmp_path / "release.parquet", 0).codes) == ["E11.9", "I10", "N18.9"]
    text = frame.assign(icd10_diag=frame["icd10_diag"].map(lambda cs: " ".join(cs)))
    text.to_csv(tmp_path / "release.csv", index=False)
    notes = mimiciv_notes(tmp_path / "release.csv", splits)
    assert notes[0].gold_codes == ("N18.9", "E11.9")


def test_unknown_codes_need_a_descriptions_table(tmp_path):
    table, _ = _release(tmp_path, diag=[["N189", "Q999X"], ["I10"], ["I10"]])
    with pytest.raises(UserError, match=r"1 code\(s\) without a description \(e.g. Q99.9X\)"):
        mimiciv_inventory(table, seed=0)
    described = tmp_path / "descriptions.csv"
    pd.DataFrame({"code": ["Q999X"], "description": ["Some Retired, Code"]}).to_csv(described, index=False)
    inventory = mimiciv_inventory(table, seed=0, descriptions=described)
    assert inventory["Q99.9X"].description == "some retired code"


def test_bad_release_files(tmp_path):
    table, splits = _release(tmp_path)
    with pytest.raises(UserError, match="missing column"):
        mimiciv_notes(splits, splits)
    pd.DataFrame({"_id": [20001], "split": ["test"]}).to_feather(tmp_path / "short_split.feather")
    with pytest.raises(UserError, match="admission 20002 is not in"):
        mimiciv_notes(table, tmp_path / "short_split.feather")
    with pytest.raises(UserError, match="no such file"):
        mimiciv_inventory(tmp_path / "absent.feather", 0)
