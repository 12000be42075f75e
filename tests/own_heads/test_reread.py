"""One checkpoint read twice (App. L.6, R-D16): the gate's cell difference, the second read's per-note
differences, clean margins and top-k agreement, by hand and against scipy, on hand-made artifacts;
the own-heads chain's --heads-from and --out-root; the R-D16 reader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from mistill.errors import UserError
from mistill.evaluate import compare as cmp
from mistill.evaluate.own_heads import run_chain
from mistill.evaluate.reread import (
    Read,
    cell_medians,
    clean_margin_difference,
    largest_cell_difference,
    per_note_differences,
    same_top_k_phases,
)
from mistill.io import read_jsonl, write_json, write_jsonl
from mistill.repro.reader_module import load_reader
from tests.own_heads.test_compare import STATS, _params, write_m6

REPO = Path(__file__).resolve().parents[2]
ARM, NOTES = "s-mistill", [f"n{i}" for i in range(9)]


def write_head_sets(hd: Path, rankings: dict[str, list[int]], n_layers: int = 2, n_heads: int = 4) -> None:
    """head_sets_contrast.json whose I_c ranks heads in the given order per phase (first = largest)."""
    phases = {p: [{"layer": h // n_heads, "head": h % n_heads, "ic": float(len(order) - i)}
                  for i, h in enumerate(order)] for p, order in rankings.items()}
    write_json(hd / "head_sets_contrast.json", {"n_layers": n_layers, "n_heads": n_heads, "phases": phases})


def read_of(root: Path, values: dict[str, float], order=(0, 1, 2, 3, 4, 5, 6, 7)) -> Read:
    write_m6(root, ARM, 0, values, dict.fromkeys(values, 1.0))
    write_head_sets(root / "HD-S" / f"{ARM}-s0", {p: list(order) for p in ("P1", "P2", "P2C")})
    return Read(root, ARM, 0)


@pytest.fixture
def first(tmp_path) -> Read:
    rng = np.random.default_rng(4)
    return read_of(tmp_path / "chain", dict(zip(NOTES, rng.uniform(0.3, 0.9, len(NOTES)).round(4))))


def test_an_identical_gate_differs_by_nothing(first, tmp_path):
    shutil.copytree(first.root, tmp_path / "gate")
    gate = Read(tmp_path / "gate", ARM, 0)
    assert largest_cell_difference(first, gate, bins=[4], min_range=1.0) == 0.0
    assert set(cell_medians(first, [4], 1.0)) == {("P1", 4), ("P2", 4), ("P2C", 4)}


def test_the_gate_difference_is_the_largest_cell_median_difference(first, tmp_path):
    values = cmp.note_recovery(cmp.knockin_rows(first.m6), phase="P2C", set_kind="top", k=4)
    moved = {n: v + (0.3 if i < 5 else 0.0) for i, (n, v) in enumerate(sorted(values.items()))}
    gate = read_of(tmp_path / "gate", moved)
    # write_m6 gives P2C and P2 the note's value and P1 a fixed 0.9: the P2C and P2 medians move alike
    expected = abs(np.median(list(moved.values())) - np.median(list(values.values())))
    assert largest_cell_difference(first, gate, bins=[4], min_range=1.0) == pytest.approx(expected)
    assert expected > 0


def test_reads_with_different_cells_are_refused(first, tmp_path):
    other = read_of(tmp_path / "other", {"n0": 0.5})
    for row_file in other.m6.glob("*/patch2.jsonl"):   # the other read knocked in no P1 event
        write_jsonl(row_file, [r for r in read_jsonl(row_file) if r["kind"] != "P1"])
    with pytest.raises(UserError, match="different cells"):
        largest_cell_difference(first, other, bins=[4], min_range=1.0)


def test_per_note_differences_of_a_second_read_against_scipy(first, tmp_path):
    base = cmp.note_recovery(cmp.knockin_rows(first.m6), phase="P2C", set_kind="top", k=4)
    deltas = dict(zip(sorted(base), [0.01, -0.02, 0.005, 0.0, 0.03, 0.002, -0.001, 0.004, 0.0]))
    second = read_of(tmp_path / "second", {n: base[n] + deltas[n] for n in base})
    out = per_note_differences(first, second, k=4, stats=STATS, min_range=1.0)
    d = np.array([deltas[n] for n in sorted(base)])
    assert out["P2C"]["median_difference"] == pytest.approx(np.median(d))
    assert out["P2"]["median_difference"] == pytest.approx(np.median(d))
    higher, lower = int((d > 0).sum()), int((d < 0).sum())
    assert (out["P2C"]["notes_higher"], out["P2C"]["notes_lower"]) == (higher, lower) == (5, 2)
    assert out["P2C"]["sign_p"] == pytest.approx(sps.binomtest(higher, higher + lower, 0.5).pvalue)
    assert out["P1"]["median_difference"] == 0.0 and out["P1"]["sign_p"] == 1.0   # no note moved: p = 1


def test_clean_margins_are_compared_event_by_event(first, tmp_path):
    shutil.copytree(first.root, tmp_path / "second")
    second = Read(tmp_path / "second", ARM, 0)
    shifts = {}
    for i, path in enumerate(sorted(second.m6.glob("*/patch2.jsonl"))):
        rows = read_jsonl(path)
        for r in rows:
            r["margin_clean"] += 0.01 * i
        write_jsonl(path, rows)
        shifts[path.parent.name] = 0.01 * i
    median, n_events = clean_margin_difference(first, second)
    assert n_events == 3 * len(NOTES)           # three events a note, every one shared
    assert median == pytest.approx(np.median(np.repeat(list(shifts.values()), 3)))


def test_top_k_agreement_counts_phases_with_the_same_set(first, tmp_path):
    shutil.copytree(first.root, tmp_path / "second")
    second = Read(tmp_path / "second", ARM, 0)
    assert same_top_k_phases(first, second, k=4) == (3, 3)
    # the same four heads in another order are the same set; a fifth head into the top four is not
    write_head_sets(second.hd, {"P1": [3, 2, 1, 0, 4, 5, 6, 7], "P2": [0, 1, 2, 4, 3, 5, 6, 7],
                                "P2C": list(range(8))})
    assert same_top_k_phases(first, second, k=4) == (2, 3)


def test_heads_from_refuses_the_attribution_stage_and_a_missing_ranking(tmp_path):
    params = _params(tmp_path)
    with pytest.raises(UserError, match="not attribute"):
        run_chain("unused", ARM, 0, params, stages=("attribute", "knockin"), heads_from=tmp_path / "HD-S")
    with pytest.raises(UserError, match="no head_sets_contrast.json"):
        run_chain("unused", ARM, 0, params, stages=("knockin",), heads_from=tmp_path / "HD-S" / "absent",
                  out_root=tmp_path / "gate")


def test_reader_writes_every_key_from_three_reads(first, tmp_path, monkeypatch):
    reader = load_reader(REPO / "readers" / "r_d16.py")
    shutil.copytree(first.root, tmp_path / "gate")
    base = cmp.note_recovery(cmp.knockin_rows(first.m6), phase="P2C", set_kind="top", k=4)
    read_of(tmp_path / "second", {n: v + 0.001 for n, v in base.items()})
    params = _params(first.root)
    params["reread"] = {"arm": ARM, "seed": 0, "gate_dir": str(tmp_path / "gate"),
                        "second_read_dir": str(tmp_path / "second")}
    values, inputs = reader.compute_values(params)
    assert sorted(values) == sorted(reader.keys(params))
    assert values["gate_largest_difference"]["value"] == 0.0
    assert values["crosshw_per_note_diff_p2c"]["value"] == pytest.approx(0.001)
    assert values["crosshw_sign_p_p2c_p2_p1"]["value"] == pytest.approx(
        [sps.binomtest(len(base), len(base), 0.5).pvalue] * 2 + [1.0])
    assert values["crosshw_median_read_difference"]["value"] == pytest.approx(0.001)
    assert values["gate_raw_margin_difference"]["value"] == 0.0   # write_m6 gives every event the clean margin 2
    assert values["crosshw_same_top_k_phases"]["value"] == 3
    assert all(Path(p).exists() for p in inputs)
    del params["reread"]
    with pytest.raises(UserError, match="no `reread` section"):
        reader.compute_values(params)
    json.dumps(values)   # plain JSON for the numbers file
