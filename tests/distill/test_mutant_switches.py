"""The recipe's mutant switches: the shifted pool (layer map off by one) and targets of other notes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mistill.distill.other_notes import borrowed, derangement, fit_rows, targets_of_other_notes
from mistill.distill.pools import build_pool
from mistill.distill.run_spec import RunSpec
from mistill.errors import UserError

HEAD_SETS = {"n_layers": 3, "n_heads": 2,
             "phases": {"P1": [{"layer": 2, "head": 1, "ic": 3.0}, {"layer": 0, "head": 0, "ic": 2.0},
                               {"layer": 1, "head": 1, "ic": 1.0}, {"layer": 0, "head": 1, "ic": 0.0},
                               {"layer": 1, "head": 0, "ic": -1.0}, {"layer": 2, "head": 0, "ic": -2.0}]}}


def test_the_shifted_pool_is_the_top_pool_one_layer_up_the_last_wrapping():
    top = build_pool(HEAD_SETS, "P1", 3, mode="top")
    shifted = build_pool(HEAD_SETS, "P1", 3, mode="shifted")
    assert top.heads == ((2, 1), (0, 0), (1, 1))
    assert shifted.heads == ((0, 1), (1, 0), (2, 1))
    assert shifted.weights == top.weights


def test_a_derangement_moves_every_item_and_is_seeded():
    for seed in range(50):
        order = derangement(5, np.random.default_rng(seed))
        assert sorted(order) == list(range(5)) and not (order == np.arange(5)).any()
    assert list(derangement(5, np.random.default_rng(3))) == list(derangement(5, np.random.default_rng(3)))
    with pytest.raises(ValueError):
        derangement(1, np.random.default_rng(0))


def test_fitted_rows_cycle_cut_pad_and_keep_each_row_s_mass():
    donor = np.array([[0.5, 0.25, 0.25], [0.0, 0.0, 1.0]])
    own = np.array([[0.6, 0.4], [1.0, 0.0], [0.3, 0.7], [0.0, 0.0]])   # 4 rows of 2 buckets (last row: no mass)
    got = fit_rows(donor, own)
    # rows cycle 0, 1, 0, 1; cut to 2 buckets; row 1 of the donor has no mass in them, so it stays zero
    np.testing.assert_allclose(got, [[2 / 3, 1 / 3], [0.0, 0.0], [2 / 3, 1 / 3], [0.0, 0.0]])
    wide = fit_rows(donor, np.full((1, 4), 0.25))
    np.testing.assert_allclose(wide, [[0.5, 0.25, 0.25, 0.0]])


def test_every_note_gets_another_note_s_targets_in_its_own_shape():
    def note(note_id, n, width, value):
        rows = np.full((n, width), 1.0 / width)
        rows[:, 0] += value
        rows /= rows.sum(1, keepdims=True)
        return SimpleNamespace(note_id=note_id, teacher={
            "P1": {"rows": rows, "m": np.full(n, value), "c": np.full(n, -value), "event_index": np.arange(n)}})

    notes = [note("a", 2, 3, 1.0), note("b", 3, 4, 2.0), note("c", 1, 2, 3.0)]
    before = {n.note_id: n.teacher["P1"] for n in notes}
    donors = targets_of_other_notes(notes, seed=0)
    assert all(d != n.note_id for d, n in zip(donors, notes))
    for n, d in zip(notes, donors):
        got, own, theirs = n.teacher["P1"], before[n.note_id], before[d]
        assert got["rows"].shape == own["rows"].shape
        np.testing.assert_array_equal(got["event_index"], own["event_index"])
        np.testing.assert_allclose(got["m"], theirs["m"][0])
        np.testing.assert_allclose(got["rows"].sum(1), own["rows"].sum(1))
        assert not np.allclose(got["rows"], own["rows"])
    assert borrowed(before["a"], None) == before["a"]   # a part the donor lacks stays the note's own


def test_targets_from_resolves_from_option_then_params_and_is_checked():
    params = {"distill": {"runs_dir": "artifacts", "precision": {"mistill": "bf16"}, "seeds": [0], "terms": ["attn"],
                          "write_norm": False, "window": 8, "heads": "top", "pool_k": {"student": 4}, "pool_seed": 0,
                          "student_head_sets": {"student_qwen": "h.json"}, "targets_dir": "t",
                          "lambda_p1": 1.0, "lambda_p2": 1.0},
              "models": {"teacher": "teacher"}}
    assert RunSpec.resolve(params, {"arm": "mistill"}).targets_from == "own"
    params["distill"]["targets_from"] = "other_notes"
    assert RunSpec.resolve(params, {"arm": "mistill"}).targets_from == "other_notes"
    assert RunSpec.resolve(params, {"arm": "mistill", "targets_from": "own"}).targets_from == "own"
    params["distill"]["targets_from"] = "elsewhere"
    with pytest.raises(UserError, match="targets_from"):
        RunSpec.resolve(params, {"arm": "mistill"})
