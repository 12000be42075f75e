"""Wilcoxon, sign and t-tests against scipy, statsmodels and hand-worked examples."""

import itertools

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.descriptivestats import sign_test as sm_sign_test

from mistill.stats.paired import (
    one_sample_t_test,
    one_sample_t_tests,
    paired_comparison,
    sign_test,
    wilcoxon_signed_rank,
)

# Differences with two zeros and ties in |d|: nonzero |d| = 1, 1, 2, 2, 3, 3.
DIFFS = np.array([1.0, 2.0, 0.0, -1.0, 3.0, 3.0, 0.0, 2.0])


def test_wilcoxon_hand_worked_with_ties_and_zeros():
    # Zeros dropped (n = 6); |d| ranks with ties averaged: 1.5, 1.5, 3.5, 3.5, 5.5, 5.5.
    # W- = 1.5 (the single -1), W+ = 21 - 1.5 = 19.5; two-sided statistic min(W+, W-) = 1.5.
    result = wilcoxon_signed_rank(DIFFS)
    assert result.statistic == 1.5
    assert (result.n_nonzero, result.n_zero, result.n) == (6, 2, 8)
    # Exact null by enumerating the 2^6 sign patterns of the tied ranks: P(W+ <= 1.5) + P(W+ >= 19.5).
    ranks = np.array([1.5, 1.5, 3.5, 3.5, 5.5, 5.5])
    w_plus = np.array([ranks[list(s)].sum() for s in itertools.product([False, True], repeat=6)])
    exact = np.mean(w_plus <= 1.5) + np.mean(w_plus >= 19.5)
    assert exact == pytest.approx(6 / 64)
    assert result.p_value == pytest.approx(exact)


def test_wilcoxon_equals_scipy_on_paired_arrays():
    rng = np.random.default_rng(0)
    a = np.round(rng.normal(0.2, 1, 80), 1)  # rounding makes ties and zero differences
    b = np.round(rng.normal(0.0, 1, 80), 1)
    b[:5] = a[:5]
    ours = wilcoxon_signed_rank(a, b)
    ref = stats.wilcoxon(a, b, zero_method="wilcox", alternative="two-sided")
    assert ours.statistic == pytest.approx(ref.statistic)
    assert ours.p_value == pytest.approx(ref.pvalue)
    assert ours.n_zero == int((a == b).sum()) >= 5


def test_wilcoxon_all_zero_differences_is_no_evidence():
    result = wilcoxon_signed_rank([0.0, 0.0, 0.0])
    assert (result.p_value, result.n_nonzero, result.n_zero) == (1.0, 0, 3)


def test_sign_test_hand_worked_and_statsmodels():
    # 9 notes higher, 1 lower, 2 ties: p = 2 * P(X <= 1), X ~ Bin(10, 1/2) = 2 * 11 / 1024.
    diff = np.array([0.1] * 9 + [-0.2] + [0.0] * 2)
    result = sign_test(diff)
    assert (result.n_positive, result.n_negative, result.n_zero, result.n) == (9, 1, 2, 12)
    assert result.p_value == pytest.approx(22 / 1024)
    assert result.p_value == pytest.approx(sm_sign_test(diff, 0)[1])
    rng = np.random.default_rng(3)
    a, b = np.round(rng.normal(size=(2, 150)), 1)
    assert sign_test(a, b).p_value == pytest.approx(sm_sign_test(a - b, 0)[1])


def test_sign_test_all_ties():
    result = sign_test([1.0, 2.0], [1.0, 2.0])
    assert (result.p_value, result.n_zero, result.n_nonzero) == (1.0, 2, 0)


def test_t_tests_equal_scipy_and_hand_worked():
    # x = 1, 2, 3, 4: mean 2.5, s = sqrt(5/3), t = 2.5 / (s / 2) = 3.8730
    single = one_sample_t_test([1.0, 2.0, 3.0, 4.0])
    assert single.t[0] == pytest.approx(2.5 / (np.sqrt(5 / 3) / 2))
    assert single.p_value[0] == pytest.approx(2 * stats.t.sf(single.t[0], df=3))
    rng = np.random.default_rng(5)
    matrix = rng.normal(0.1, 1, size=(100, 50))
    ours = one_sample_t_tests(matrix, popmean=0.05)
    ref = stats.ttest_1samp(matrix, 0.05, axis=0)
    np.testing.assert_allclose(ours.t, ref.statistic)
    np.testing.assert_allclose(ours.p_value, ref.pvalue)
    np.testing.assert_allclose(ours.mean, matrix.mean(axis=0))


def test_t_tests_constant_columns():
    matrix = np.column_stack([np.zeros(5), np.full(5, 0.3), np.full(5, -0.2), np.arange(5.0)])
    result = one_sample_t_tests(matrix)
    assert (result.t[0], result.p_value[0]) == (0.0, 1.0)  # a head never touched: no evidence
    assert (result.t[1], result.p_value[1]) == (np.inf, 0.0)
    assert (result.t[2], result.p_value[2]) == (-np.inf, 0.0)
    assert np.isfinite(result.p_value).all()


def test_paired_comparison_combines_the_tests():
    rng = np.random.default_rng(8)
    a = np.round(rng.normal(0.3, 1, 150), 2)
    b = np.round(rng.normal(0.0, 1, 150), 2)
    result = paired_comparison(a, b, seed=0)
    assert result.n == 150
    assert result.mean_difference.estimate == pytest.approx(np.mean(a - b))
    assert result.median_difference == pytest.approx(np.median(a - b))
    assert result.wilcoxon.p_value == pytest.approx(stats.wilcoxon(a - b, zero_method="wilcox").pvalue)
    assert result.sign.n_positive == int((a > b).sum())
    assert result.mean_difference.low < result.mean_difference.estimate < result.mean_difference.high
