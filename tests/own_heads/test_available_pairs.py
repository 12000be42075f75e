"""Seed pairs over different notes (App. L.4): by hand, and equal to the note-clustered comparison when every
pair covers every note."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from mistill.evaluate.available_pairs import available_pair_comparison
from mistill.evaluate.compare import clustered
from mistill.stats import StatsParams

STATS = StatsParams(bootstrap_resamples=400, bootstrap_seed=0, confidence=0.95)


def test_full_coverage_equals_the_note_clustered_comparison():
    rng = np.random.default_rng(0)
    notes = [f"n{i}" for i in range(12)]
    arm = {s: dict(zip(notes, rng.uniform(0.5, 1.0, 12))) for s in (0, 1, 2)}
    ref = {s: dict(zip(notes, rng.uniform(0.4, 0.9, 12))) for s in (0, 1, 2)}
    got, want = available_pair_comparison(arm, ref, STATS), clustered(arm, ref, STATS)
    for key in ("n_notes", "mean_difference", "ci_low", "ci_high", "notes_higher", "notes_lower", "sign_p",
                "wilcoxon_p"):
        assert got[key] == pytest.approx(want[key]), key
    assert got["per_note_difference"] == pytest.approx(want["per_note_difference"])


def test_uneven_coverage_by_hand():
    arm = {0: {"a": 0.9, "b": 0.8}, 1: {"a": 0.7, "c": 0.6}}
    ref = {0: {"a": 0.5, "b": 0.9, "c": 0.1}, 1: {"a": 0.6, "c": 0.2, "d": 0.3}}
    got = available_pair_comparison(arm, ref, STATS)
    # pair 0 on a, b (c not in the arm's seed 0); pair 1 on a, c (d not in the arm's seed 1)
    per_note = {"a": ((0.9 - 0.5) + (0.7 - 0.6)) / 2, "b": 0.8 - 0.9, "c": 0.6 - 0.2}
    assert got["notes"] == ["a", "b", "c"]
    assert got["per_note_difference"] == pytest.approx(per_note)
    assert got["mean_difference"] == pytest.approx(np.mean(list(per_note.values())))
    assert [p["n_notes"] for p in got["seed_pairs"]] == [2, 2]
    assert got["seed_pairs"][0]["mean_difference"] == pytest.approx((0.4 - 0.1) / 2)
    assert (got["notes_higher"], got["notes_lower"]) == (2, 1)
    assert got["sign_p"] == pytest.approx(scipy_stats.binomtest(2, 3, 0.5).pvalue)
    assert got["ci_low"] <= got["mean_difference"] <= got["ci_high"]


def test_no_shared_note_is_none():
    assert available_pair_comparison({0: {"a": 1.0}}, {0: {"b": 0.0}}, STATS) is None
