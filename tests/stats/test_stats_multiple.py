"""Benjamini-Hochberg and Bonferroni against hand-worked examples and a brute-force step-up."""

import numpy as np
from scipy import stats

from mistill.stats.multiple import benjamini_hochberg, bonferroni, head_discoveries


def _brute_force_bh(p, fdr):
    """The step-up rule read straight off Benjamini & Hochberg (1995)."""
    m = len(p)
    order = np.argsort(p)
    passing = [k for k in range(1, m + 1) if p[order[k - 1]] <= k * fdr / m]
    rejected = np.zeros(m, dtype=bool)
    if passing:
        rejected[order[: max(passing)]] = True
    q = np.empty(m)
    q[order] = np.minimum.accumulate((p[order] * m / np.arange(1, m + 1))[::-1])[::-1]
    return rejected, np.minimum(q, 1)


def test_bh_hand_worked():
    # sorted: 0.005 <= .01, 0.01 <= .02, 0.03 <= .03, 0.04 <= .04, 0.2 > .05  ->  4 discoveries
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.2])
    result = benjamini_hochberg(p, 0.05, signs=[1.0, -2.0, 0.5, -0.1, 3.0])
    np.testing.assert_array_equal(result.rejected, [True, True, True, True, False])
    assert (result.n_discoveries, result.n_positive, result.n_negative) == (4, 2, 2)
    assert (result.n_tests, result.level, result.method) == (5, 0.05, "fdr_bh")


def test_bh_step_up_rejects_above_the_first_threshold():
    # p_(1) = 0.02 > 0.05/4, but p_(4) = 0.045 <= 4 * 0.05 / 4: step-up rejects all four.
    result = benjamini_hochberg([0.02, 0.03, 0.04, 0.045], 0.05)
    assert result.n_discoveries == 4
    assert bonferroni([0.02, 0.03, 0.04, 0.045], 0.05).n_discoveries == 0


def test_bh_equals_brute_force_on_random_p_values_with_ties():
    rng = np.random.default_rng(0)
    p = np.concatenate([rng.uniform(size=300), rng.uniform(0, 0.002, size=40), [0.001] * 5, [0.0] * 2])
    result = benjamini_hochberg(p, 0.05)
    rejected, q = _brute_force_bh(p, 0.05)
    np.testing.assert_array_equal(result.rejected, rejected)
    np.testing.assert_allclose(result.adjusted_p, q)
    assert result.n_positive == result.n_discoveries  # no signs given: all counted positive


def test_bonferroni_hand_worked():
    result = bonferroni([0.01, 0.0001, 0.02, 0.5], 0.05, signs=[-1, 1, 1, 1])
    np.testing.assert_array_equal(result.rejected, [True, True, False, False])  # threshold 0.0125
    assert (result.n_positive, result.n_negative) == (1, 1)
    np.testing.assert_allclose(result.adjusted_p, [0.04, 0.0004, 0.08, 1.0])


def test_head_discoveries_find_planted_signed_effects():
    rng = np.random.default_rng(1)
    per_note = rng.normal(0, 1, size=(100, 400))
    per_note[:, :6] += 1.0  # six heads with a consistent positive effect
    per_note[:, 6:9] -= 1.0  # three negative
    result = head_discoveries(per_note, 0.05)
    assert (result.discoveries.n_positive, result.discoveries.n_negative) == (6, 3)
    assert set(np.flatnonzero(result.discoveries.rejected)) == set(range(9))
    np.testing.assert_allclose(result.p_value, stats.ttest_1samp(per_note, 0.0).pvalue)
    assert result.n_notes == 100
