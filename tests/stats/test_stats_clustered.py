"""Note-clustered, seed-matched comparisons against a hand-worked example."""

import numpy as np
import pytest
from scipy import stats

from mistill.stats.bootstrap import bootstrap_mean
from mistill.stats.checks import StatsInputError
from mistill.stats.clustered import matched_seed_pairs, mean_over_seeds, note_clustered_comparison

# Three seeds of two arms over five notes, in eighths so that differences that cancel are exactly 0
# (the library counts exact zeros, as scipy does).
ARM = {0: [4, 2, 7, 3, 2], 1: [5, 1, 6, 3, 4], 2: [6, 3, 5, 3, 1]}
REF = {0: [3, 2, 4, 3, 3], 1: [4, 3, 5, 3, 1], 2: [2, 1, 5, 3, 3]}
ARM = {s: np.array(v) / 8 for s, v in ARM.items()}
REF = {s: np.array(v) / 8 for s, v in REF.items()}


def test_seed_pairing_rules():
    assert matched_seed_pairs([0, 1, 2], [2, 1, 0]) == [(0, 0), (1, 1), (2, 2)]
    assert matched_seed_pairs([0, 1, 2], [0]) == [(0, 0), (1, 0), (2, 0)]  # one-seed reference
    assert matched_seed_pairs([3], [0, 1]) == [(3, 0), (3, 1)]
    with pytest.raises(StatsInputError, match="seed sets differ"):
        matched_seed_pairs([0, 1], [0, 2])


def test_hand_worked_seed_matched_clustered_comparison():
    result = note_clustered_comparison(ARM, REF, seed=0, n_resamples=200)
    # seed pairs (0,0), (1,1), (2,2); per-note differences in eighths:
    #   pair 0: 1, 0, 3, 0, -1   pair 1: 1, -2, 1, 0, 3   pair 2: 4, 2, 0, 0, -2
    # per-note means (eighths): 2, 0, 4/3, 0, 0
    np.testing.assert_allclose(result.per_note_difference, np.array([2, 0, 4 / 3, 0, 0]) / 8)
    assert (result.sign.n_positive, result.sign.n_negative, result.sign.n_zero) == (2, 0, 3)
    assert result.sign.p_value == pytest.approx(0.5)  # two of two non-zero notes higher
    assert result.median_difference == pytest.approx(0.0, abs=1e-12)
    # pooled note pairs: 15 differences, 7 positive, 3 negative, 5 zero (descriptive only)
    assert result.per_note_difference[1] == 0.0 and result.per_note_difference[4] == 0.0
    assert (
        result.pooled.n_note_pairs,
        result.pooled.n_positive,
        result.pooled.n_negative,
        result.pooled.n_zero,
    ) == (15, 7, 3, 5)
    assert [(p.arm_seed, p.reference_seed) for p in result.seed_pairs] == [(0, 0), (1, 1), (2, 2)]
    assert [(p.sign.n_positive, p.sign.n_negative) for p in result.seed_pairs] == [(2, 1), (3, 1), (2, 1)]
    expected = bootstrap_mean(result.per_note_difference, n_resamples=200, seed=0)
    assert (result.mean_difference.low, result.mean_difference.high) == (expected.low, expected.high)
    assert result.mean_difference.estimate == pytest.approx((2 + 4 / 3) / 8 / 5)
    assert result.n_notes == 5


def test_one_seed_reference_pairs_with_every_seed():
    result = note_clustered_comparison(ARM, {0: REF[0]}, seed=0, n_resamples=100)
    expected = np.mean([np.subtract(ARM[s], REF[0]) for s in ARM], axis=0)
    np.testing.assert_allclose(result.per_note_difference, expected)
    assert len(result.seed_pairs) == 3


def test_clustered_wilcoxon_is_over_notes_not_pairs():
    rng = np.random.default_rng(0)
    arm = {s: rng.normal(0.1, 1, 150) for s in range(3)}
    ref = {s: rng.normal(0.0, 1, 150) for s in range(3)}
    result = note_clustered_comparison(arm, ref, seed=0)
    per_note = np.mean([arm[s] - ref[s] for s in range(3)], axis=0)
    assert result.wilcoxon.p_value == pytest.approx(stats.wilcoxon(per_note, zero_method="wilcox").pvalue)
    assert result.sign.n == 150 and result.pooled.n_note_pairs == 450


def test_mean_over_seeds():
    np.testing.assert_allclose(mean_over_seeds(ARM), np.mean([ARM[0], ARM[1], ARM[2]], axis=0))


def test_mismatched_note_counts_raise():
    with pytest.raises(StatsInputError, match="different note counts"):
        note_clustered_comparison({0: [1.0, 2.0]}, {0: [1.0, 2.0, 3.0]}, seed=0)
    with pytest.raises(StatsInputError, match="different note counts"):
        note_clustered_comparison({0: [1.0, 2.0], 1: [1.0]}, {0: [1.0, 2.0]}, seed=0)
