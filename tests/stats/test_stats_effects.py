"""Recovery, necessity, gap recovered and note-level aggregation on hand-worked examples."""

import numpy as np
import pytest

from mistill.stats.checks import StatsInputError
from mistill.stats.effects import (
    gap_recovered,
    knock_in_recovery,
    mean_of_note_means,
    median_of_note_means,
    necessity,
    note_means,
)


def test_gap_recovered_hand_worked():
    # teacher micro-F1 0.227 (App. K); base 0.10, arm 0.18: (0.18 - 0.10) / (0.227 - 0.10)
    assert gap_recovered(0.18, 0.10, 0.227) == pytest.approx(0.08 / 0.127)
    assert gap_recovered(0.10, 0.10, 0.227) == 0.0
    assert gap_recovered(0.227, 0.10, 0.227) == pytest.approx(1.0)
    with pytest.raises(StatsInputError, match="gap is zero"):
        gap_recovered(0.2, 0.1, 0.1)


def test_knock_in_recovery_with_range_gate():
    m_corr = np.array([-8.0, -2.0, 0.0, 1.0])
    m_all = np.array([2.0, 1.0, 0.5, 3.0])  # ranges 10, 3, 0.5 (fails the 1-nat gate), 2
    m_set = np.array([0.6, -0.5, 0.4, 3.0])
    result = knock_in_recovery(m_set, m_corr, m_all)
    np.testing.assert_array_equal(result.passed, [True, True, False, True])
    np.testing.assert_allclose(result.recovery, [8.6 / 10, 1.5 / 3, 2.0 / 2])
    assert (result.n_events, result.n_passed, result.pass_rate) == (4, 3, 0.75)
    # all heads knocked in recovers exactly 1 (the validation invariant, Sec. 2.3)
    np.testing.assert_allclose(knock_in_recovery(m_all, m_corr, m_all).recovery, 1.0)


def test_necessity_hand_worked():
    np.testing.assert_allclose(necessity([2.0, 4.0, -1.0], [0.5, 4.0, 0.0]), [0.75, 0.0, 1.0])
    with pytest.raises(StatsInputError, match="zero clean margin"):
        necessity([2.0, 0.0], [1.0, 1.0])


def test_median_of_note_means_hand_worked():
    # note a: events 0.2, 0.6 -> 0.4; note b: 1.0 -> 1.0; note c: 0.0, 0.1, 0.5 -> 0.2
    values = [0.2, 1.0, 0.0, 0.6, 0.1, 0.5]
    notes = ["a", "b", "c", "a", "c", "c"]
    ids, means = note_means(values, notes)
    assert ids == ("a", "b", "c")
    np.testing.assert_allclose(means, [0.4, 1.0, 0.2])
    median = median_of_note_means(values, notes)
    assert median.estimate == pytest.approx(0.4)
    assert (median.n_notes, median.n_values) == (3, 6)
    assert median.statistic == "median over notes of per-note means"
    assert np.median(values) == pytest.approx(0.35)  # the median over events is a different number
    assert mean_of_note_means(values, notes).estimate == pytest.approx(1.6 / 3)
